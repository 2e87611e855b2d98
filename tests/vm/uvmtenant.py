"""A CUDA-shaped user of /dev/nvidia-uvm for the VM tests, run inside a cgroup.

It does what libcuda did on an H100 (BENCHMARKS.md, 2026-11-27, eleventh session): at start-up
UVM_INITIALIZE, then UVM_ALLOC_SEMAPHORE_POOL of 2 MiB and an mmap of exactly that range; for
cuMemAllocManaged one shared, fixed mmap of the UVM file with offset == address and no ioctl.
It prints one JSON object: RM statuses, errnos, whether what was mapped can be written, and how
many UVM ranges nvmock holds while the mappings live.

    python -m tests.vm.uvmtenant MIB     a managed range of MIB MiB, written at both ends if made
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
from typing import Any

from qpolicy.nvrm import abi
from tests.vm.conftest import objects

PROT_NONE, PROT_RW = 0, 3
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
POOL_BYTES = 2 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


def reserve(size: int) -> int:
    """An address range of ``size`` bytes nobody uses, 2 MiB aligned, as libcuda reserves VA."""
    flags = MAP_PRIVATE | MAP_ANONYMOUS
    base = libc.mmap(None, size + POOL_BYTES, PROT_NONE, flags, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    return (base + POOL_BYTES - 1) & ~(POOL_BYTES - 1)


def uvm_call(fd: int, cmd: int, layout: abi.Layout, **fields: int) -> int:
    """One UVM ioctl: its rmStatus (the ioctl itself must succeed)."""
    buf = ctypes.create_string_buffer(layout.size)
    for name, offset, fmt in layout.fields:
        if name in fields:
            struct.pack_into("<" + fmt, buf, offset, fields[name])
    assert libc.ioctl(fd, cmd, buf) == 0, os.strerror(ctypes.get_errno())
    return layout.unpack(buf.raw)["rmStatus"]


def map_uvm(fd: int, addr: int, size: int, offset: int | None = None) -> int:
    """mmap of the UVM file at ``addr``, shared and fixed: 0, or the errno."""
    got = libc.mmap(
        addr, size, PROT_RW, MAP_SHARED | MAP_FIXED, fd, addr if offset is None else offset
    )
    return 0 if got == addr else ctypes.get_errno()


def writes(addr: int, size: int) -> bool:
    """Both ends of a mapping take a write and read it back."""
    for at in (addr, addr + size - PAGE):
        ctypes.memset(at, 0x5A, PAGE)
        if ctypes.string_at(at, PAGE) != b"\x5a" * PAGE:
            return False
    return True


def main(mib: int) -> dict[str, Any]:
    size = mib << 20
    fd = os.open("/dev/nvidia-uvm", os.O_RDWR)
    report: dict[str, Any] = {}
    pool = reserve(POOL_BYTES)
    report["before_init"] = map_uvm(fd, pool, POOL_BYTES)  # EBADFD: nothing before INITIALIZE
    report["init"] = uvm_call(fd, abi.UVM_INITIALIZE, abi.UVM_INITIALIZE_PARAMS, flags=0)
    report["pool"] = uvm_call(
        fd, abi.UVM_ALLOC_SEMAPHORE_POOL, abi.UVM_ALLOC_SEMAPHORE_POOL_PARAMS,
        base=pool, length=POOL_BYTES,
    )  # fmt: skip
    report["pool_map"] = map_uvm(fd, pool, POOL_BYTES)
    report["pool_write"] = report["pool_map"] == 0 and writes(pool, POOL_BYTES)
    managed = reserve(size)
    report["bad_offset"] = map_uvm(fd, managed, size, offset=managed + POOL_BYTES)
    report["managed"] = map_uvm(fd, managed, size)
    report["managed_write"] = report["managed"] == 0 and writes(managed, size)
    report["uvm_ranges"] = objects()["uvm_ranges"]
    if report["managed"] == 0:
        libc.munmap(managed, size)
    libc.munmap(pool, POOL_BYTES)
    report["free"] = uvm_call(fd, abi.UVM_FREE, abi.UVM_FREE_PARAMS, base=pool, length=POOL_BYTES)
    os.close(fd)
    return report


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
