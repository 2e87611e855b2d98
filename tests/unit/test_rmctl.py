"""RM controls on behalf of another process: descriptor borrowing and request packing.

The control path itself needs an NVIDIA driver (the VM tier's nvmock, or a real GPU); here the
pieces that do not: pidfd_getfd on this very process, the byte layout of the parameters, and how
a refusal by the kernel is reported.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

import pytest

from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.rmctl import (
    RM_CONTROL_REQUEST,
    ControlResult,
    RmError,
    borrow_fd,
    disable_channels,
    disable_channels_params,
    rm_control,
)


def test_borrowing_a_descriptor_gives_the_same_open_file(tmp_path: object) -> None:
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        copy = borrow_fd(os.getpid(), fd)
        try:
            assert copy != fd
            assert os.fstat(copy).st_rdev == os.fstat(fd).st_rdev
        finally:
            os.close(copy)
    finally:
        os.close(fd)


def test_borrowing_from_a_missing_process_or_fd_is_a_clear_error() -> None:
    with pytest.raises(RmError, match="cannot open process"):
        borrow_fd(2**22 + 12345, 0)
    with pytest.raises(RmError, match="cannot take fd 987654"):
        borrow_fd(os.getpid(), 987654)


def test_disable_channels_params_layout() -> None:
    params = disable_channels_params(0xC1D0001B, [0x5C00001C, 0x5C000022], disable=True)
    assert len(params) == 536
    assert params[0] == 1 and struct.unpack_from("<I", params, 4)[0] == 2
    assert struct.unpack_from("<2I", params, 24) == (0xC1D0001B, 0xC1D0001B)
    assert struct.unpack_from("<3I", params, 280) == (0x5C00001C, 0x5C000022, 0)
    assert params[8] == 0  # bOnlyDisableScheduling: running work taken off the engine
    resume = disable_channels_params(1, [2], disable=False)
    assert resume[0] == 0
    only = disable_channels_params(1, [2], disable=True, only_scheduling=True)
    full = disable_channels_params(1, [2], disable=True)
    assert only[0] == 1 and only[8] == 1 and only[9:] == full[9:] and full[8] == 0
    with pytest.raises(ValueError, match="1 to 64 channels"):
        disable_channels_params(1, list(range(65)), disable=True)


def test_a_close_rm_refuses_part_of_is_undone_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """130 channels are three controls; RM refuses the second close. GSP counts closes, so the
    first chunk (closed) and the second (whatever GSP did of it) are opened again: the caller
    is left with none closed, and its next try closes each once."""
    sent: list[tuple[bool, list[int]]] = []

    def control(fd: int, client: int, obj: int, cmd: int, params: bytearray) -> ControlResult:
        disable = bool(params[0])
        count = struct.unpack_from("<I", params, 4)[0]
        sent.append((disable, list(struct.unpack_from(f"<{count}I", params, 280))))
        refused = disable and len([s for s in sent if s[0]]) == 2
        return ControlResult(abi.NvStatus.NV_ERR_INVALID_STATE if refused else 0, 1000)

    monkeypatch.setattr(rmctl, "rm_control", control)
    channels = list(range(1, 131))
    result = disable_channels(9, 1, 2, channels, disable=True)
    assert result.status == abi.NvStatus.NV_ERR_INVALID_STATE and result.duration_ns == 4000
    assert sent == [
        (True, channels[:64]),
        (True, channels[64:128]),
        (False, channels[:64]),
        (False, channels[64:128]),
    ]
    # An open RM refuses is left there: a close would undo nothing, and the rest is not sent.
    calls: list[bytearray] = []

    def refuse(fd: int, client: int, obj: int, cmd: int, params: bytearray) -> ControlResult:
        calls.append(params)
        return ControlResult(abi.NvStatus.NV_ERR_INVALID_STATE, 1)

    monkeypatch.setattr(rmctl, "rm_control", refuse)
    assert not disable_channels(9, 1, 2, channels, disable=False).ok
    assert len(calls) == 1 and calls[0][0] == 0


def test_a_close_whose_ioctl_fails_midway_is_undone_and_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second chunk's ioctl fails (RmError: RM may have acted on it or not): both chunks
    sent are opened again, an undo that fails too does not stop the others, and the caller
    gets the error."""
    sent: list[tuple[bool, int]] = []

    def control(fd: int, client: int, obj: int, cmd: int, params: bytearray) -> ControlResult:
        disable = bool(params[0])
        first = struct.unpack_from("<I", params, 280)[0]
        sent.append((disable, first))
        if (disable and len(sent) == 2) or (not disable and first == 1):
            raise rmctl.RmError("RM_CONTROL: Interrupted system call")
        return ControlResult(0, 1000)

    monkeypatch.setattr(rmctl, "rm_control", control)
    with pytest.raises(rmctl.RmError, match="Interrupted"):
        disable_channels(9, 1, 2, list(range(1, 131)), disable=True)
    assert sent == [(True, 1), (True, 65), (False, 1), (False, 65)]


def test_handle_class_asks_the_client_for_its_objects_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GET_HANDLE_INFO goes to the client object itself, names the handle and index CLASSID
    (2), and RM writes the class into the 64-bit data at offset 8 (ctrl0000client.h)."""
    asked: list[tuple[int, int, int, bytes]] = []

    def control(fd: int, client: int, obj: int, cmd: int, params: bytearray) -> ControlResult:
        asked.append((client, obj, cmd, bytes(params[:8])))
        handle = struct.unpack_from("<I", params, 0)[0]
        if handle == 0x5C000010:
            struct.pack_into("<Q", params, 8, 0xC86F)
            return ControlResult(0, 1)
        return ControlResult(abi.NvStatus.NV_ERR_OBJECT_NOT_FOUND, 1)

    monkeypatch.setattr(rmctl, "rm_control", control)
    assert rmctl.handle_class(9, 0xC1D0001B, 0x5C000010) == 0xC86F
    assert rmctl.handle_class(9, 0xC1D0001B, 0x5C000011) is None
    assert asked[0] == (0xC1D0001B, 0xC1D0001B, 0xD02, struct.pack("<II", 0x5C000010, 2))


def test_a_channel_is_lost_where_rm_freed_or_invalidated_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GET_CLASS_ENGINEID on the channel, naming the client's own handle: a working channel
    refuses it (NV_ERR_INVALID_ARGUMENT, measured), an invalidated one is NV_ERR_RESOURCE_LOST,
    a freed one NV_ERR_OBJECT_NOT_FOUND."""
    answers = {
        0x5C000020: abi.NvStatus.NV_ERR_INVALID_ARGUMENT,
        0x5C000021: abi.NvStatus.NV_ERR_RESOURCE_LOST,
        0x5C000022: abi.NvStatus.NV_ERR_OBJECT_NOT_FOUND,
    }
    asked: list[tuple[int, int, int, int]] = []

    def control(fd: int, client: int, obj: int, cmd: int, params: bytearray) -> ControlResult:
        asked.append((client, obj, cmd, struct.unpack_from("<I", params, 0)[0]))
        return ControlResult(answers[obj], 1)

    monkeypatch.setattr(rmctl, "rm_control", control)
    lost = [rmctl.channel_lost(9, 0xC1D0001B, channel) for channel in answers]
    assert lost == [False, True, True]
    assert asked[0] == (0xC1D0001B, 0x5C000020, 0x906F0101, 0xC1D0001B)


def test_the_request_is_rm_control_on_nvidiactl() -> None:
    assert RM_CONTROL_REQUEST == 0xC020462A


def test_a_control_the_kernel_rejects_raises_with_the_reason() -> None:
    fd = os.open("/dev/null", os.O_RDWR)
    try:
        with pytest.raises(RmError, match=r"NVA06C_CTRL_CMD_SET_TIMESLICE on fd .* failed"):
            rm_control(fd, 1, 2, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, bytearray(8))
        with pytest.raises(RmError, match="FIFO_DISABLE_CHANNELS"):
            disable_channels(fd, 1, 2, [3], disable=True)
    finally:
        os.close(fd)


class CapturingIoctl:
    """The libc ioctl: remembers each request's bytes and writes RM's status where the layout
    has it."""

    def __init__(self, layout: abi.Layout, status: int = 0, fail: int = 0) -> None:
        self.layout, self.status, self.fail = layout, status, fail
        self.seen: list[tuple[int, int, dict[str, int]]] = []

    def __call__(self, fd: int, request: int, buffer: Any) -> int:
        self.seen.append((fd, request, self.layout.unpack(bytes(buffer))))
        if self.fail:
            ctypes.set_errno(self.fail)
            return -1
        offset = next(o for n, o, _ in self.layout.fields if n == "status")
        struct.pack_into("<I", buffer, offset, self.status)
        return 0


def test_an_allocation_and_a_mapping_are_the_drivers_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = CapturingIoctl(abi.NVOS21, status=0x57)
    monkeypatch.setattr(rmctl._libc, "ioctl", fake)
    assert rmctl.alloc(5, 0xC1D00001, 0xC1D00001, 0x10, 0x90CE, b"\x01" * 128) == 0x57
    fd, request, sent = fake.seen[0]
    assert (fd, request) == (5, abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.RM_ALLOC, 32))
    assert (sent["hRoot"], sent["hObjectParent"], sent["hObjectNew"], sent["hClass"]) == (
        0xC1D00001, 0xC1D00001, 0x10, 0x90CE,
    )  # fmt: skip
    assert sent["paramsSize"] == 128 and sent["pAllocParms"] != 0
    fake = CapturingIoctl(abi.NVOS33_WITH_FD)
    monkeypatch.setattr(rmctl._libc, "ioctl", fake)
    assert rmctl.map_memory(5, 0xC1D00001, 0xC1D00001, 0x10, 4096, 1, 9) == 0
    fd, request, sent = fake.seen[0]
    assert request == abi.iowr(abi.NV_IOCTL_MAGIC, abi.Escape.RM_MAP_MEMORY, 56)
    assert (sent["hDevice"], sent["hMemory"], sent["length"], sent["flags"], sent["fd"]) == (
        0xC1D00001, 0x10, 4096, 1, 9,
    )  # fmt: skip
    monkeypatch.setattr(rmctl._libc, "ioctl", CapturingIoctl(abi.NVOS33_WITH_FD, fail=errno.EFAULT))
    with pytest.raises(rmctl.RmError, match="RM_MAP_MEMORY on fd 5 failed: Bad address"):
        rmctl.map_memory(5, 1, 1, 0x10, 4096, 1, 9)
