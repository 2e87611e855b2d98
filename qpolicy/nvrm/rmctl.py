"""RM controls sent on behalf of another process: the rm enforcer's levers.

Root can take a copy of a tenant's ``/dev/nvidiactl`` descriptor with ``pidfd_getfd(2)`` and issue
RM_CONTROL on the tenant's own objects (its client, subdevice, TSG and channel handles), which RM
accepts because the control arrives on the file the client lives on (docs/gpu-measurements.md
§2). Of the scheduling levers measured, ``FIFO_DISABLE_CHANNELS`` stops and resumes a process's
channels, and ``SET_TIMESLICE`` (small values) changed how soon it yields on the H200 once, and on
the H100 (§5).

Everything here is a thin, typed wrapper over one ioctl; callers own the descriptors.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from qpolicy.errors import QPolicyError
from qpolicy.nvrm import abi

_SYS_PIDFD_GETFD = 438  # x86_64 and every architecture using the generic syscall table
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_libc.ioctl.restype = ctypes.c_int

RM_CONTROL_REQUEST = abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.RM_CONTROL, abi.NVOS54.size)
RM_ALLOC_REQUEST = abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.RM_ALLOC, abi.NVOS21.size)
RM_FREE_REQUEST = abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.RM_FREE, abi.NVOS00.size)


class RmError(QPolicyError):
    """An RM control could not be sent (the ioctl failed) or RM refused it (a status)."""


def borrow_fd(pid: int, fd: int) -> int:
    """A descriptor of this process for ``pid``'s ``fd`` (same open file): pidfd_getfd(2).

    Needs ptrace access to the target (root, or CAP_SYS_PTRACE). The caller closes it.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as error:
        raise RmError(f"cannot open process {pid}: {error.strerror}") from None
    try:
        return borrow_fd_from(pidfd, pid, fd)
    finally:
        os.close(pidfd)


def borrow_fd_from(pidfd: int, pid: int, fd: int) -> int:
    """:func:`borrow_fd` through a pidfd the caller holds (``pid`` only names it in errors)."""
    result = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    if result < 0:
        err = ctypes.get_errno()
        hint = " (needs root or CAP_SYS_PTRACE)" if err == errno.EPERM else ""
        raise RmError(f"cannot take fd {fd} of process {pid}: {os.strerror(err)}{hint}")
    return int(result)


@dataclass(frozen=True, slots=True)
class ControlResult:
    status: int
    duration_ns: int

    @property
    def ok(self) -> bool:
        return self.status == abi.NvStatus.NV_OK


def rm_control(fd: int, client: int, obj: int, cmd: int, params: bytearray) -> ControlResult:
    """Send RM_CONTROL ``cmd`` to ``obj`` of ``client`` over ``fd``; ``params`` is updated."""
    buffer = (ctypes.c_char * max(len(params), 1)).from_buffer(params or bytearray(1))
    request = ctypes.create_string_buffer(
        abi.NVOS54.pack(
            hClient=client,
            hObject=obj,
            cmd=cmd,
            params=ctypes.addressof(buffer) if params else 0,
            paramsSize=len(params),
        ),
        abi.NVOS54.size,
    )
    start = time.perf_counter_ns()
    ret = _libc.ioctl(fd, RM_CONTROL_REQUEST, request)
    duration = time.perf_counter_ns() - start
    if ret != 0:
        err = ctypes.get_errno()
        raise RmError(f"RM control {abi.control_name(cmd)} on fd {fd} failed: {os.strerror(err)}")
    status = abi.NVOS54.unpack(request.raw)["status"]
    return ControlResult(status, duration)


def _offset(layout: abi.Layout, name: str) -> int:
    return next(offset for field, offset, _ in layout.fields if field == name)


class HandleAsker:
    """``GET_HANDLE_INFO`` and ``GET_CHILD_HANDLE`` about any client, over one descriptor: what
    qpolicy.nvrm.discover asks, up to a million times per descriptor. The request is built once
    and only its handles are written per call (packing every field per call was most of the
    cost)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.asked = 0
        #: RM's status for the last question (why it said no).
        self.status = 0
        info = abi.NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS
        child = abi.NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE_PARAMS
        self._info = ctypes.create_string_buffer(info.size)
        self._child = ctypes.create_string_buffer(child.size)
        self._info_request = self._request(abi.NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO, self._info)
        self._child_request = self._request(
            abi.NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE, self._child
        )
        self._at = {
            "hClient": _offset(abi.NVOS54, "hClient"),
            "status": _offset(abi.NVOS54, "status"),
            "hObject": _offset(info, "hObject"),
            "data": _offset(info, "data"),
            "hParent": _offset(child, "hParent"),
            "child": _offset(child, "hObject"),
        }

    @staticmethod
    def _request(cmd: int, params: ctypes.Array[ctypes.c_char]) -> ctypes.Array[ctypes.c_char]:
        packed = abi.NVOS54.pack(
            cmd=cmd, params=ctypes.addressof(params), paramsSize=ctypes.sizeof(params)
        )
        return ctypes.create_string_buffer(packed, len(packed))

    def _send(self, request: ctypes.Array[ctypes.c_char], client: int) -> bool:
        # The control goes to the client object itself (hObject = hClient).
        struct.pack_into("<II", request, self._at["hClient"], client, client)
        self.asked += 1
        if _libc.ioctl(self.fd, RM_CONTROL_REQUEST, request) != 0:
            err = ctypes.get_errno()
            raise RmError(f"RM control on fd {self.fd} failed: {os.strerror(err)}")
        self.status = struct.unpack_from("<I", request, self._at["status"])[0]
        return self.status == abi.NvStatus.NV_OK

    def info(self, client: int, handle: int, index: int) -> int | None:
        """``client``'s object ``handle``: its class or its parent (``index``), None where RM
        says no (no such client on this file, no such handle in it)."""
        struct.pack_into("<II", self._info, self._at["hObject"], handle, index)
        if not self._send(self._info_request, client):
            return None
        data: int = struct.unpack_from("<Q", self._info, self._at["data"])[0]
        return data

    def child(self, client: int, parent: int, cls: int) -> int | None:
        """The handle of ``parent``'s first child in ``client`` whose RM-internal class id is
        ``cls`` (e.g. :data:`~qpolicy.nvrm.abi.NVOC_CLASS_ID_DEVICE`), or None."""
        struct.pack_into("<III", self._child, self._at["hParent"], parent, cls, 0)
        if not self._send(self._child_request, client):
            return None
        found: int = struct.unpack_from("<I", self._child, self._at["child"])[0]
        return found or None


def alloc_client(fd: int) -> int | None:
    """A client allocated on ``fd``, numbered by RM: its handle, None where RM refuses. It lives
    until freed, or until the file is closed."""
    request = ctypes.create_string_buffer(
        abi.NVOS21.pack(hClass=abi.NV01_ROOT_CLIENT), abi.NVOS21.size
    )
    if _libc.ioctl(fd, RM_ALLOC_REQUEST, request) != 0:
        err = ctypes.get_errno()
        raise RmError(f"RM_ALLOC on fd {fd} failed: {os.strerror(err)}")
    answer = abi.NVOS21.unpack(request.raw)
    return answer["hObjectNew"] if answer["status"] == abi.NvStatus.NV_OK else None


def _send(on: int, request: int, layout: abi.Layout, what: str, /, **fields: int) -> int:
    """One ioctl on descriptor ``on`` whose parameters are ``layout`` packed from ``fields``;
    RM's status in them."""
    buffer = ctypes.create_string_buffer(layout.pack(**fields), layout.size)
    if _libc.ioctl(on, request, buffer) != 0:
        err = ctypes.get_errno()
        raise RmError(f"{what} on fd {on} failed: {os.strerror(err)}")
    status: int = layout.unpack(buffer.raw)["status"]
    return status


def alloc(fd: int, client: int, parent: int, handle: int, cls: int, params: bytes) -> int:
    """Allocate object ``handle`` of class ``cls`` under ``parent`` in ``client`` (RM_ALLOC);
    returns RM's status."""
    buffer = ctypes.create_string_buffer(params, max(len(params), 1))
    return _send(
        fd, RM_ALLOC_REQUEST, abi.NVOS21, f"RM_ALLOC of class {cls:#x}",
        hRoot=client, hObjectParent=parent, hObjectNew=handle, hClass=cls,
        pAllocParms=ctypes.addressof(buffer) if params else 0, paramsSize=len(params),
    )  # fmt: skip


RM_MAP_MEMORY_REQUEST = abi.iowr(
    abi.NV_IOCTL_MAGIC, abi.Escape.RM_MAP_MEMORY, abi.NVOS33_WITH_FD.size
)
REGISTER_FD_REQUEST = abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.REGISTER_FD, 4)


def register_fd(device_fd: int, ctl_fd: int) -> int:
    """Tie ``device_fd`` (``/dev/nvidiaN``) to ``ctl_fd``'s clients, as libcuda does after each
    open (``NV_ESC_REGISTER_FD``); returns 0 or the errno."""
    arg = ctypes.create_string_buffer(ctl_fd.to_bytes(4, "little"), 4)
    return 0 if _libc.ioctl(device_fd, REGISTER_FD_REQUEST, arg) == 0 else ctypes.get_errno()


def map_memory(
    fd: int, client: int, device: int, memory: int, length: int, flags: int, target_fd: int
) -> int:
    """``RM_MAP_MEMORY`` of ``memory`` onto ``target_fd``, which ``mmap`` at offset 0 then maps
    (nv-mmap.c, ``nvidia_mmap_helper``); ``device`` is the client itself for memory allocated
    under it (mapping_cpu.c, ``bClientAlloc``). Returns RM's status."""
    return _send(
        fd, RM_MAP_MEMORY_REQUEST, abi.NVOS33_WITH_FD, "RM_MAP_MEMORY",
        hClient=client, hDevice=device, hMemory=memory, length=length, flags=flags,
        fd=target_fd,
    )  # fmt: skip


def newest_client_handle(path: str = "/dev/nvidiactl") -> int | None:
    """The handle RM gives a client allocated now: the newest there is (RM numbers clients with
    one counter that only grows; rs_server.c, ``serverAllocClient``). The client is freed again
    with the file. None where ``path`` cannot be opened or RM refuses."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return alloc_client(fd)
    except RmError:
        return None
    finally:
        os.close(fd)


class ClientCheck:
    """Whether a client handle is in use, found out without a question RM logs.

    A control sent to a client that does not exist writes a kernel log line
    (``RmDeprecatedGetControlHandler``, rmapi_deprecated_control.c: ``serverGetClientUnderLock``
    at LEVEL_ERROR; call 23I, an H200). Allocating a client *at* that handle tells the same
    silently: RM takes a client handle the caller names (nvidia.ko is built with
    ``RS_COMPATABILITY_MODE``, src/nvidia/Makefile) and answers ``NV_ERR_INSERT_DUPLICATE_NAME``
    where one is in use (rs_server.c, ``_serverCreateEntryAndLockForNewClient``; neither it nor
    ``rmapiAllocWithSecInfo`` prints above LEVEL_INFO on failure); where none is, the client
    made on this daemon's own ``/dev/nvidiactl`` is freed at once. RM's counter is not moved by
    a named handle, and the handles asked are older than it: the clients RM numbers meanwhile do
    not collide. A tenant naming that very handle in the microseconds it is held would be
    refused (libcuda and NVML let RM number their clients)."""

    def __init__(self, path: str = "/dev/nvidiactl") -> None:
        self._path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.checked = 0
        self._alloc = ctypes.create_string_buffer(abi.NVOS21.size)
        self._free = ctypes.create_string_buffer(abi.NVOS00.size)
        self._alloc_status = _offset(abi.NVOS21, "status")
        self._alloc_made = _offset(abi.NVOS21, "hObjectNew")
        self._free_status = _offset(abi.NVOS00, "status")

    def in_use(self, handle: int) -> bool | None:
        """Whether RM holds a client ``handle``; None where RM answered neither way (the
        question is then to be asked the old way)."""
        self.checked += 1
        struct.pack_into(
            "<IIII", self._alloc, 0, handle, handle, handle, abi.NV01_ROOT_CLIENT
        )  # hRoot (the handle asked for), hObjectParent, hObjectNew, hClass
        struct.pack_into("<QII", self._alloc, 16, 0, 0, 0)  # no parameters; status
        if _libc.ioctl(self.fd, RM_ALLOC_REQUEST, self._alloc) != 0:
            err = ctypes.get_errno()
            raise RmError(f"RM_ALLOC on fd {self.fd} failed: {os.strerror(err)}")
        status = struct.unpack_from("<I", self._alloc, self._alloc_status)[0]
        if status == abi.NvStatus.NV_ERR_INSERT_DUPLICATE_NAME:
            return True
        if status != abi.NvStatus.NV_OK:
            return None
        made: int = struct.unpack_from("<I", self._alloc, self._alloc_made)[0]
        # Freed whatever RM named it (the file's close would free it too).
        struct.pack_into("<IIII", self._free, 0, made, made, made, 0)
        freed = _libc.ioctl(self.fd, RM_FREE_REQUEST, self._free) == 0
        if not freed or struct.unpack_from("<I", self._free, self._free_status)[0] != 0:
            # Not freed: closing the file frees every client on it.
            os.close(self.fd)
            self.fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
        return False if made == handle else None

    def close(self) -> None:
        os.close(self.fd)


def disable_channels_params(
    client: int, channels: Sequence[int], *, disable: bool, only_scheduling: bool = False
) -> bytearray:
    """NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS for up to 64 channels of one client.

    ``only_scheduling`` sets bOnlyDisableScheduling: by ctrl2080fifo.h the channels are no longer
    scheduled but, where running, are not taken off the hardware (what GSP then does is measured
    by tools/gpu/sched_only.py)."""
    if not 0 < len(channels) <= abi.FIFO_DISABLE_CHANNELS_MAX:
        raise ValueError(f"1 to {abi.FIFO_DISABLE_CHANNELS_MAX} channels, got {len(channels)}")
    return bytearray(_disable_channels_packed(client, tuple(channels), disable, only_scheduling))


@functools.lru_cache(maxsize=256)
def _disable_channels_packed(
    client: int, channels: tuple[int, ...], disable: bool, only_scheduling: bool
) -> bytes:
    # The rm enforcer closes and opens the same pods' channels at every turn: packing the 130
    # fields field by field was a quarter of its Python time (py-spy, tools/bench/daemon.py).
    fields = disable_channels_fields(
        client, channels, disable=disable, only_scheduling=only_scheduling
    )
    return abi.NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS.pack(**fields)


def disable_channels_fields(
    client: int, channels: Sequence[int], *, disable: bool, only_scheduling: bool = False
) -> dict[str, int]:
    """NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS' fields for ``channels`` (64 at most) of one
    client, for a caller that sends fields rather than packed bytes (the doctor's Lab)."""
    fields: dict[str, int] = {
        "bDisable": int(disable),
        "numChannels": len(channels),
        "bOnlyDisableScheduling": int(only_scheduling),
    }
    for index, channel in enumerate(channels):
        fields[f"hClientList{index}"] = client
        fields[f"hChannelList{index}"] = channel
    return fields


def disable_channels(
    fd: int,
    client: int,
    subdevice: int,
    channels: Sequence[int],
    *,
    disable: bool,
    only_scheduling: bool = False,
) -> ControlResult:
    """Stop (``disable``) or resume a client's channels; one control per 64 channels.

    A close RM refuses is undone: every chunk sent, the refused one included, is opened again,
    so the call closes all of the channels or none. GSP counts closes (a channel closed twice
    runs only after two opens), so channels left closed by a failed call would be closed twice
    by the caller's next try; and an open of a channel not closed does nothing (an H200:
    tools/gpu/disable_nesting.py), which makes undoing the refused chunk safe whether or not
    GSP acted on part of it."""
    total = 0
    chunks = [
        channels[start : start + abi.FIFO_DISABLE_CHANNELS_MAX]
        for start in range(0, len(channels), abi.FIFO_DISABLE_CHANNELS_MAX)
    ]
    for sent, chunk in enumerate(chunks, 1):
        try:
            result = _send_disable(fd, client, subdevice, chunk, disable, only_scheduling)
        except RmError:
            # The ioctl itself failed (a signal, the file going away): RM may have acted on
            # this chunk, so it is undone with the others.
            if disable:
                _undo_closes(fd, client, subdevice, chunks[:sent])
            raise
        total += result.duration_ns
        if not result.ok:
            if disable:
                total += _undo_closes(fd, client, subdevice, chunks[:sent])
            return ControlResult(result.status, total)
    return ControlResult(abi.NvStatus.NV_OK, total)


def _undo_closes(fd: int, client: int, subdevice: int, chunks: Sequence[Sequence[int]]) -> int:
    """Open ``chunks`` again, each whatever became of the others; the time it took (ns). An
    open that fails is left: its channels were either never closed or are on a file that is
    going away, and the caller reports the close as failed either way."""
    total = 0
    for chunk in chunks:
        try:
            total += _send_disable(fd, client, subdevice, chunk, False, False).duration_ns
        except RmError:
            continue
    return total


def _send_disable(
    fd: int,
    client: int,
    subdevice: int,
    chunk: Sequence[int],
    disable: bool,
    only_scheduling: bool,
) -> ControlResult:
    params = disable_channels_params(
        client, chunk, disable=disable, only_scheduling=only_scheduling
    )
    return rm_control(fd, client, subdevice, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, params)


def set_timeslice(fd: int, client: int, tsg: int, timeslice_us: int) -> ControlResult:
    params = bytearray(timeslice_us.to_bytes(8, "little"))
    return rm_control(fd, client, tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, params)


def get_timeslice(fd: int, client: int, tsg: int) -> tuple[ControlResult, int]:
    params = bytearray(8)
    result = rm_control(fd, client, tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, params)
    return result, int.from_bytes(params, "little")


def preemption_saves(fd: int, client: int, subdevice: int, tsg: int) -> tuple[ControlResult, int]:
    """How many times GR saved ``tsg``'s context while it had work running: its CILP, CTA and
    GfxP saves (``GR_GET_CTXSW_STATS``). A context switched out at a kernel boundary, or with
    nothing to run, is saved by wait-for-idle (WFI) and not counted. Measured by the doctor
    (docs/levers.md): an 8192 trainer, whose kernels run 1.4 ms, taken off the GPU at 1 us
    slices was saved by CILP nearly every time, on an H100 and an H200; a 2048 trainer
    (24 us kernels) under native time-slicing, switched at kernel boundaries, by WFI 1 208
    times of 1 210."""
    result, answer = control(
        fd, client, subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS, hChannel=tsg
    )
    return result, answer["cilpSaveCnt"] + answer["ctaSaveCnt"] + answer["gfxpSaveCnt"]


def get_compute_preemption(
    fd: int, client: int, subdevice: int, channel: int
) -> tuple[ControlResult, int]:
    """The compute preemption mode of ``channel``'s context (0 WFI, 1 CTA, 2 CILP), as
    ``GR_GET_CTXSW_MODES`` answers it. CILP on every channel of both GPUs measured (the doctor's
    reads, docs/levers.md)."""
    result, answer = control(
        fd, client, subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, hChannel=channel
    )
    return result, answer["cilpPreemptMode"]


def set_compute_preemption(
    fd: int, client: int, subdevice: int, channel: int, mode: int
) -> ControlResult:
    """Give ``channel``'s context the compute preemption mode ``mode`` (0 WFI, 1 CTA, 2 CILP):
    ``GR_SET_CTXSW_PREEMPTION_MODE`` with the CILP flag, the only field it then reads (libcuda's
    own call in the shipped H200 trace is this one, mode 2)."""
    result, _ = control(
        fd,
        client,
        subdevice,
        abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
        flags=abi.PREEMPTION_MODE_FLAG_CILP,
        hChannel=channel,
        cilpPreemptMode=mode,
    )
    return result


def handle_class(fd: int, client: int, handle: int) -> int | None:
    """The class of ``client``'s object ``handle`` as RM knows it now (``GET_HANDLE_INFO``,
    index CLASSID: ``cliresCtrlCmdClientGetHandleInfo``, answered by the kernel side of RM), or
    None where RM knows no such object in that client."""
    result, answer = control(
        fd,
        client,
        client,
        abi.NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO,
        hObject=handle,
        index=abi.HANDLE_INFO_INDEX_CLASSID,
    )
    return answer["data"] if result.ok else None


def channel_lost(fd: int, client: int, channel: int) -> bool:
    """Whether RM no longer has ``client``'s ``channel`` working: freed, or invalidated with an
    object it depended on (serverFreeResourceTree in 580.142's resserv frees such a dependent
    with bInvalidateOnly: its handle stays, so ``GET_HANDLE_INFO`` still answers, measured on an
    H100; a control on it answers ``NV_ERR_RESOURCE_LOST``, serverControl). Asked with a control
    the host answers with no effect: the engine of the object the client's own handle names,
    which a working channel refuses with ``NV_ERR_INVALID_ARGUMENT`` (measured on an H100:
    tests/vm/rmcases.py ``channel_queries``). Not its work-submit token: RM writes that into the
    tenant's notifier (kchannelNotifyWorkSubmitToken)."""
    result, _ = control(fd, client, channel, abi.NV906F_CTRL_GET_CLASS_ENGINEID, hObject=client)
    return result.status in (
        abi.NvStatus.NV_ERR_RESOURCE_LOST,
        abi.NvStatus.NV_ERR_OBJECT_NOT_FOUND,
    )


@dataclass(frozen=True, slots=True)
class PciAddress:
    domain: int
    bus: int
    slot: int

    def __str__(self) -> str:
        """As Linux names the device: ``0000:3b:00`` (the function is always 0 for a GPU)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}"


def gpu_pci_address(fd: int, client: int, subdevice: int) -> PciAddress | None:
    """The PCI address of the GPU behind ``subdevice`` of ``client``, or None if RM says no.

    Two controls on the client's own objects: the subdevice's gpuId, then that GPU's PCI
    information from the client (root) object.
    """
    params = bytearray(4)
    result = rm_control(fd, client, subdevice, abi.NV2080_CTRL_CMD_GPU_GET_ID, params)
    if not result.ok:
        return None
    layout = abi.CONTROLS[abi.NV0000_CTRL_CMD_GPU_GET_PCI_INFO].params
    info = bytearray(layout.pack(gpuId=int.from_bytes(params, "little")))
    result = rm_control(fd, client, client, abi.NV0000_CTRL_CMD_GPU_GET_PCI_INFO, info)
    if not result.ok:
        return None
    fields = layout.unpack(bytes(info))
    return PciAddress(fields["domain"], fields["bus"], fields["slot"])


def control(
    fd: int, client: int, obj: int, cmd: int, **fields: int
) -> tuple[ControlResult, dict[str, int]]:
    """Send ``cmd`` with its parameters packed from ``fields`` by the layout abi.CONTROLS knows;
    returns RM's answer and the parameters as RM left them."""
    layout = abi.CONTROLS[cmd].params
    params = bytearray(layout.pack(**fields))
    result = rm_control(fd, client, obj, cmd, params)
    return result, layout.unpack(bytes(params))
