"""Bad input: random ioctls and mmaps, and processes killed in the middle of calls, leave no oops,
WARN or leaked object, and nvmock serves a real workload afterwards."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import random
import signal
import struct
import subprocess
import time

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape
from tests.vm.gpuload import Gpuload
from tests.vm.nvmock import BAD_KERNEL_LOG, GPULOAD, kernel_log, objects
from tests.vm.rmclient import Rm, sysmem_params, tsg_params

KNOWN = [int(e) for e in Escape]
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
POINTERS = [0, 0x1000, 0xDEAD0000, 0xFFFFFFFF81000000, 0xFFFF888000000000, (1 << 64) - 8]
SIZES = [0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 144, 184, 536, 560, 2304, 2608]


def random_buffer(rng: random.Random, size: int, handles: list[int], valid: int) -> bytearray:
    data = bytearray(rng.getrandbits(8) for _ in range(size))
    # Real handles and pointers where structs keep them, now and then, to get past the checks.
    for offset in range(0, size - 3, 4):
        roll = rng.random()
        if roll < 0.15:
            struct.pack_into("<I", data, offset, rng.choice(handles))
        elif roll < 0.2 and offset % 8 == 0 and offset + 8 <= size:
            struct.pack_into("<Q", data, offset, rng.choice([*POINTERS, valid]))
        elif roll < 0.25:
            struct.pack_into("<I", data, offset, 0)
    return data


def fuzz_process(seed: int) -> dict[int, int]:
    """A process's objects (client, device, subdevice, TSG, system memory) and fds, then
    fuzz() with them: the errnos of the calls the driver refused."""
    rm = Rm()
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, handle=0x5C000002)
    subdevice = rm.new(client, device, 0x2080, handle=0x5C000003)
    tsg = rm.new(client, device, 0xA06C, tsg_params(), handle=0x5C000004)
    sysmem = rm.new(client, device, 0x3E, sysmem_params(1 << 20), handle=0x5C000005)
    handles = [client, device, subdevice, tsg, sysmem, 0x5C000006, 0xC1D00000, 0xCAF00000]
    valid = ctypes.create_string_buffer(4096)
    fds = [rm.ctl, rm.gpu, rm.open_gpu(), rm.open_ctl(), rm.open_ctl()]
    try:
        return fuzz(random.Random(seed), fds, handles, ctypes.addressof(valid))
    finally:
        rm.close()


def test_ten_thousand_random_ioctls_and_mmaps() -> None:
    errors = fuzz_process(20261121)
    # Something was refused, and nothing broke the kernel.
    assert errors
    bad = [line for line in kernel_log().splitlines() if BAD_KERNEL_LOG.search(line)]
    assert not bad, "\n".join(bad)
    assert not any(objects().values())
    # nvmock still serves a workload.
    result = Gpuload(["--seconds", "1", "--kernel-us", "500"]).ready().result()
    assert result["kernels"] > 0


def fuzz(rng: random.Random, fds: list[int], handles: list[int], valid: int) -> dict[int, int]:
    errors: dict[int, int] = {}
    for i in range(10_000):
        fd = rng.choice(fds)
        nr = rng.choice(KNOWN) if rng.random() < 0.8 else rng.randrange(256)
        size = rng.choice(SIZES) if rng.random() < 0.7 else rng.randrange(16384)
        cmd = abi.iowr(abi.NV_IOCTL_MAGIC if rng.random() < 0.9 else rng.randrange(256), nr, size)
        try:
            if size and rng.random() < 0.85:
                arg = random_buffer(rng, min(size, 4096), handles, valid)
                if len(arg) < size:
                    arg.extend(bytes(size - len(arg)))
                fcntl.ioctl(fd, cmd, arg, True)
            else:
                # A raw pointer (fcntl.ioctl takes only a C int): NULL, unmapped, kernel.
                if LIBC.ioctl(fd, cmd, ctypes.c_void_p(rng.choice(POINTERS))) < 0:
                    raise OSError(ctypes.get_errno(), "ioctl")
        except OSError as error:
            errors[error.errno] = errors.get(error.errno, 0) + 1
        if i % 50 == 0:
            try:
                length = rng.choice([4096, 8192, 65536, 1 << 20, 3 << 20])
                mapped = mmap.mmap(rng.choice(fds), length, offset=rng.choice([0, 0, 4096]))
                mapped[0:4] = b"\1\2\3\4"
                mapped.close()
            except (OSError, ValueError):
                pass
    return errors


def test_processes_killed_in_the_middle_of_calls_leak_nothing() -> None:
    rng = random.Random(7)
    for _ in range(6):
        # Allocating and freeing device memory as fast as it can, killed at a random moment.
        proc = subprocess.Popen(
            [str(GPULOAD), "--seconds", "30", "--steps", "1000000", "--no-free"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.3 + rng.random())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(objects().values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(objects().values()), objects()
