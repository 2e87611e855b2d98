"""RM controls on behalf of another process: descriptor borrowing and request packing.

The control path itself needs an NVIDIA driver (the VM tier's nvmock, or a real GPU); here the
pieces that do not: pidfd_getfd on this very process, the byte layout of the parameters, and how
a refusal by the kernel is reported.
"""

from __future__ import annotations

import os
import struct

import pytest

from qpolicy.nvrm import abi
from qpolicy.nvrm.rmctl import (
    RM_CONTROL_REQUEST,
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
