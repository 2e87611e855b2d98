"""A small RM client for the VM tests: the escapes a CUDA process sends, issued from Python.

It packs the structs with the layouts of qpolicy.nvrm.abi (the same facts as kmod/uapi/nvrm.h)
and keeps inner parameter buffers alive while the driver reads and writes them. Like libcuda
(every RM_ALLOC of the shipped H200 trace names its handle), it names the objects it makes,
clients excepted; ``handle=0`` leaves the choice to RM, which qgpu refuses to configured
cgroups (kmod/qgpu/ioctl.c, unnamed_refused()).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from dataclasses import dataclass

from qpolicy.nvrm import abi

NVOS64 = struct.Struct(
    "<IIIIQQIIII"
)  # hRoot hParent hNew hClass pAllocParms pRights size flags status pad
NVOS00 = struct.Struct("<IIII")
NVOS54 = struct.Struct("<IIIIQII")
NVOS33_FD = struct.Struct("<IIIIQQQIIiI")
NVOS55 = struct.Struct("<IIIIIII")  # hClient hParent hObject hClientSrc hObjectSrc flags status
VERSION = struct.Struct("<II64s")
CARD = struct.Struct("<B3xIBBBxHHIH2xQQQQI10s2x")
NAMED_BASE = 0x5C100000  # beside gpuload's 0x5C000000 (tools/gpuload), away from RM's 0xCAF00000


class RmError(Exception):
    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what}: {abi.status_name(status)}")
        self.status = status


def ioctl(fd: int, nr: int, arg: bytearray) -> None:
    """Send escape ``nr`` with ``arg`` (updated in place); OSError on a layer error."""
    fcntl.ioctl(fd, abi.iowr(abi.NV_IOCTL_MAGIC, nr, len(arg)), arg, True)


@dataclass
class Alloc:
    status: int
    handle: int
    params: bytes


class Rm:
    """One process's view: a control fd and a GPU fd registered with it."""

    named = NAMED_BASE  # the last handle name() gave (a class default for bare instances)

    def __init__(self, gpu: int = 0, dev: str = "/dev") -> None:
        self.dev = dev
        self.gpu_index = gpu
        self.ctl = os.open(f"{dev}/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        self.gpu = os.open(f"{dev}/nvidia{gpu}", os.O_RDWR | os.O_CLOEXEC)
        self.register(self.gpu)
        self.fds = [self.ctl, self.gpu]

    def name(self) -> int:
        """A handle for a new object, as libcuda picks them: its own, never reused."""
        self.named += 1
        return self.named

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def register(self, fd: int) -> None:
        ioctl(fd, abi.Escape.REGISTER_FD, bytearray(struct.pack("<i", self.ctl)))

    def open_gpu(self) -> int:
        fd = os.open(f"{self.dev}/nvidia{self.gpu_index}", os.O_RDWR | os.O_CLOEXEC)
        self.register(fd)
        self.fds.append(fd)
        return fd

    def open_ctl(self) -> int:
        fd = os.open(f"{self.dev}/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
        self.fds.append(fd)
        return fd

    def alloc(
        self,
        root: int,
        parent: int,
        cls: int,
        params: bytes | None = None,
        handle: int | None = None,
    ) -> Alloc:
        """RM_ALLOC; ``handle`` None: named here (a client: by RM); 0: left to RM."""
        if handle is None:
            handle = 0 if abi.class_kind(cls) is abi.Kind.CLIENT else self.name()
        inner = ctypes.create_string_buffer(params, len(params)) if params is not None else None
        address = ctypes.addressof(inner) if inner is not None else 0
        arg = bytearray(
            NVOS64.pack(root, parent, handle, cls, address, 0, len(params or b""), 0, 0, 0)
        )
        ioctl(self.ctl, abi.Escape.RM_ALLOC, arg)
        fields = NVOS64.unpack(arg)
        return Alloc(fields[8], fields[2], inner.raw if inner is not None else b"")

    def new(
        self,
        root: int,
        parent: int,
        cls: int,
        params: bytes | None = None,
        handle: int | None = None,
    ) -> int:
        result = self.alloc(root, parent, cls, params, handle)
        if result.status != abi.NvStatus.NV_OK:
            raise RmError(f"RM_ALLOC class 0x{cls:x}", result.status)
        return result.handle

    def free(self, root: int, parent: int, handle: int) -> int:
        arg = bytearray(NVOS00.pack(root, parent, handle, 0))
        ioctl(self.ctl, abi.Escape.RM_FREE, arg)
        return NVOS00.unpack(arg)[3]

    def control(
        self, client: int, obj: int, cmd: int, params: bytes, fd: int | None = None
    ) -> tuple[int, bytes]:
        inner = ctypes.create_string_buffer(params, len(params))
        arg = bytearray(NVOS54.pack(client, obj, cmd, 0, ctypes.addressof(inner), len(params), 0))
        ioctl(self.ctl if fd is None else fd, abi.Escape.RM_CONTROL, arg)
        return NVOS54.unpack(arg)[6], inner.raw

    def dup(
        self, client: int, parent: int, src_client: int, src: int, handle: int | None = None
    ) -> tuple[int, int]:
        """RM_DUP_OBJECT: (status, the new handle); ``handle`` as for alloc()."""
        if handle is None:
            handle = self.name()
        arg = bytearray(NVOS55.pack(client, parent, handle, src_client, src, 0, 0))
        ioctl(self.ctl, abi.Escape.RM_DUP_OBJECT, arg)
        fields = NVOS55.unpack(arg)
        return int(fields[6]), int(fields[2])

    def surface_info(
        self, client: int, memory: int, indices: list[int], fill: int = 0
    ) -> tuple[int, list[int]]:
        """GET_SURFACE_INFO on a memory object with a list of ``indices``, each entry's data
        ``fill`` going in: (status, each entry's data as the list holds it after the call)."""
        entries = b"".join(struct.pack("<II", index, fill) for index in indices)
        info = ctypes.create_string_buffer(entries, len(entries))
        params = struct.pack("<IIQ", len(indices), 0, ctypes.addressof(info))
        status, _ = self.control(client, memory, abi.NV0041_CTRL_CMD_GET_SURFACE_INFO, params)
        data = [struct.unpack_from("<I", info.raw, 8 * i + 4)[0] for i in range(len(indices))]
        return status, data

    def mem_size(self, client: int, memory: int) -> tuple[int, int]:
        """GET_SURFACE_INFO on a memory object: (status, its size in bytes as RM allocated it)."""
        indices = [abi.SURFACE_INFO_INDEX_PHYS_SIZE_LO, abi.SURFACE_INFO_INDEX_PHYS_SIZE_HI]
        status, (lo, hi) = self.surface_info(client, memory, indices)
        return status, hi << 32 | lo

    def handle_info(self, client: int, handle: int, index: int) -> tuple[int, int]:
        """CLIENT_GET_HANDLE_INFO on the client: (status, the parent's handle or the class)."""
        params = struct.pack("<IIQ", handle, index, 0)
        status, out = self.control(
            client, client, abi.NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO, params
        )
        return status, int(struct.unpack_from("<Q", out, 8)[0])

    def map_memory(
        self, client: int, device: int, memory: int, length: int, target: int
    ) -> tuple[int, int]:
        arg = bytearray(NVOS33_FD.pack(client, device, memory, 0, 0, length, 0, 0, 0, target, 0))
        ioctl(self.ctl, abi.Escape.RM_MAP_MEMORY, arg)
        fields = NVOS33_FD.unpack(arg)
        return fields[7], fields[6]


# NV_MEMORY_ALLOCATION_PARAMS.owner (offset 0): RM refuses 0, ~0 and its scratch owners
# (stdmemValidateParams, standard_mem.c; the real driver answered NV_ERR_INVALID_OWNER to 0).
# libcuda names its client; any other value RM accepts will do for the tests.
MEMORY_OWNER = 0x5C0FFEE0


# attr's LOCATION (26:25) PCI: RM refuses system memory whose location is VIDMEM, attr's default
# (sysmemConstruct, system_mem.c; the real driver answered NV_ERR_INVALID_ARGUMENT to it).
SYSMEM_ATTR = 1 << 25


def memory_params(size: int, owner: int = MEMORY_OWNER, attr: int = 0) -> bytes:
    params = bytearray(128)
    struct.pack_into("<III", params, 0, owner, 0, 0)
    struct.pack_into("<I", params, 24, attr)
    struct.pack_into("<Q", params, 64, size)
    return bytes(params)


def sysmem_params(size: int, owner: int = MEMORY_OWNER) -> bytes:
    """NV01_MEMORY_SYSTEM's parameters: ``memory_params`` placed in system memory."""
    return memory_params(size, owner, SYSMEM_ATTR)


def offset_of(params: bytes) -> int:
    return int(struct.unpack_from("<Q", params, 80)[0])


def channel_params(gpfifo_va: int, entries: int = 512, flags: int = 0) -> bytes:
    params = bytearray(368)
    struct.pack_into("<QII", params, 8, gpfifo_va, entries, flags)
    struct.pack_into("<I", params, 128, 1)
    return bytes(params)


def tsg_params() -> bytes:
    return struct.pack("<IIIIB3x", 0, 0, 0, 1, 0)
