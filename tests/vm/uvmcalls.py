"""Calls on /dev/nvidia-uvm from Python, as libcuda makes them: ioctls whose answer is an
rmStatus, and shared fixed mappings of the file at offset == address.

Used by the UVM tenant of the VM tests (tests/vm/uvmtenant.py) and by the UVM cases that run on
nvmock and on a real driver alike (tests/vm/rmcases.py), so it needs nothing of the VM's.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from qpolicy.nvrm import abi

PROT_NONE, PROT_RW = 0, 3
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MADV_DOFORK = 11
POOL_BYTES = 2 << 20  # libcuda's semaphore pool (BENCHMARKS.md, 2026-11-27, eleventh session)
PAGE = os.sysconf("SC_PAGE_SIZE")
FAILED = ctypes.c_void_p(-1).value

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
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_void_p,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


def _reservation(size: int) -> int:
    """Inaccessible memory of ``size`` bytes and 2 MiB more, so that ``size`` bytes of it are
    2 MiB aligned: its start."""
    base = libc.mmap(None, size + POOL_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    assert base not in (None, FAILED), os.strerror(ctypes.get_errno())
    return int(base)


def _aligned(base: int) -> int:
    return (base + POOL_BYTES - 1) & ~(POOL_BYTES - 1)


def reserve(size: int) -> int:
    """An address range of ``size`` bytes nobody uses, 2 MiB aligned, as libcuda reserves VA
    (kept for the process's life: see reserved() for one given back)."""
    return _aligned(_reservation(size))


@contextmanager
def reserved(size: int) -> Iterator[int]:
    """reserve(), with the whole reservation unmapped on the way out (whatever was mapped
    over it since)."""
    base = _reservation(size)
    try:
        yield _aligned(base)
    finally:
        libc.munmap(base, size + POOL_BYTES)


@contextmanager
def uvm_file() -> Iterator[int]:
    """/dev/nvidia-uvm opened (not initialized), closed on the way out."""
    fd = os.open("/dev/nvidia-uvm", os.O_RDWR | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def uvm_call(fd: int, cmd: int, layout: abi.Layout, **fields: int) -> int:
    """One UVM ioctl: its rmStatus (the ioctl itself must succeed)."""
    buf = ctypes.create_string_buffer(layout.size)
    for name, offset, fmt in layout.fields:
        if name in fields:
            struct.pack_into("<" + fmt, buf, offset, fields[name])
    if libc.ioctl(fd, cmd, buf) != 0:
        raise OSError(ctypes.get_errno(), f"UVM ioctl {cmd}")
    return layout.unpack(buf.raw)["rmStatus"]


def initialize(fd: int) -> int:
    """UVM_INITIALIZE with no flags, as libcuda sends it: its rmStatus."""
    return uvm_call(fd, abi.UVM_INITIALIZE, abi.UVM_INITIALIZE_PARAMS, flags=0)


def alloc_pool(fd: int, base: int, length: int = POOL_BYTES) -> int:
    """UVM_ALLOC_SEMAPHORE_POOL at ``base`` (libcuda's 2 MiB by default): its rmStatus."""
    params = abi.UVM_ALLOC_SEMAPHORE_POOL_PARAMS
    return uvm_call(fd, abi.UVM_ALLOC_SEMAPHORE_POOL, params, base=base, length=length)


def free(fd: int, base: int, length: int = POOL_BYTES) -> int:
    """UVM_FREE of the range at ``base``: its rmStatus."""
    return uvm_call(fd, abi.UVM_FREE, abi.UVM_FREE_PARAMS, base=base, length=length)


def map_uvm(fd: int, addr: int, size: int, offset: int | None = None) -> int:
    """mmap of the UVM file at ``addr``, shared and fixed: 0, or the errno."""
    got = libc.mmap(
        addr, size, PROT_RW, MAP_SHARED | MAP_FIXED, fd, addr if offset is None else offset
    )
    return 0 if got == addr else ctypes.get_errno()


def move(addr: int, size: int, to: int) -> int:
    """mremap of a mapping to ``to`` (fixed, same size): 0, or the errno."""
    got = libc.mremap(addr, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, to)
    return 0 if got == to else ctypes.get_errno()


def child_reads(addr: int) -> str:
    """A forked child reads a byte at ``addr``: "read 0xNN", or the signal that ended it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        faulthandler.disable()  # a SIGBUS ends it quietly
        value = ctypes.string_at(addr, 1)[0]
        os.write(write, f"read {value:#04x}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return said


def writes(addr: int, size: int) -> bool:
    """Both ends of a mapping take a write and read it back."""
    for at in (addr, addr + size - PAGE):
        ctypes.memset(at, 0x5A, PAGE)
        if ctypes.string_at(at, PAGE) != b"\x5a" * PAGE:
            return False
    return True
