"""nvmock's /dev/nvidia-uvm where a mapping is copied: fork with MADV_DOFORK (libcuda's
mappings are VM_DONTCOPY, but a process may ask otherwise). nvidia-uvm disables the child's
copy of a semaphore pool's or a managed range's mapping and takes its pages off it
(kernel-open/nvidia-uvm/uvm.c at 580.142: uvm_vm_open_semaphore_pool(), uvm_vm_open_managed(),
uvm_disable_vma()); the parent keeps its own. Until 2026-12-06 nvmock left the parent's pages
mapped in the child. What UVM_FREE answers about a mapped, unmapped or moved pool is held to an
H100's answers by test_nvmock_reality.py (rmcases.py uvm_pool_free)."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from qpolicy.nvrm.abi import NvStatus
from tests.vm.conftest import objects
from tests.vm.uvmcalls import (
    PAGE,
    POOL_BYTES,
    alloc_pool,
    free,
    initialize,
    libc,
    map_uvm,
    reserved,
)

MADV_DOFORK = 11


@contextmanager
def uvm_file() -> Iterator[int]:
    fd = os.open("/dev/nvidia-uvm", os.O_RDWR | os.O_CLOEXEC)
    try:
        assert initialize(fd) == NvStatus.NV_OK
        yield fd
    finally:
        os.close(fd)


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


def test_a_forked_copy_of_a_pools_mapping_is_disabled_and_the_parent_keeps_the_pool() -> None:
    with uvm_file() as fd, reserved(POOL_BYTES) as pool:
        assert alloc_pool(fd, pool) == NvStatus.NV_OK
        assert map_uvm(fd, pool, POOL_BYTES) == 0
        assert libc.madvise(pool, POOL_BYTES, MADV_DOFORK) == 0
        ctypes.memset(pool + PAGE, 0x5A, 1)
        assert child_reads(pool + PAGE) == "SIGBUS"
        assert ctypes.string_at(pool + PAGE, 1) == b"\x5a"  # the parent's mapping still maps it
        assert free(fd, pool) == NvStatus.NV_ERR_INVALID_ARGUMENT  # still mapped on the CPU
        libc.munmap(pool, POOL_BYTES)
        assert free(fd, pool) == NvStatus.NV_OK
    assert objects()["uvm_ranges"] == 0


def test_a_forked_copy_of_a_managed_mapping_gets_none_of_the_parents_pages() -> None:
    size = 4 * POOL_BYTES
    with uvm_file() as fd, reserved(size) as managed:
        assert map_uvm(fd, managed, size) == 0
        assert libc.madvise(managed, size, MADV_DOFORK) == 0
        ctypes.memset(managed, 0x5A, PAGE)  # the page comes on this touch
        assert child_reads(managed) == "SIGBUS"
        # The fork took the page off the parent's mapping too; its touch brings it back.
        assert ctypes.string_at(managed, 1) == b"\x5a"
        assert objects()["uvm_ranges"] == 1
        libc.munmap(managed, size)
    assert objects()["uvm_ranges"] == 0


def test_a_pool_whose_mapping_was_split_is_off_the_cpu_and_may_be_freed() -> None:
    """A partial munmap splits the pool's mapping: uvm_vm_open_semaphore_pool() disables both
    parts and takes the pool off the CPU, so UVM_FREE frees it while the other half is still
    mapped (from the source; a move, which takes the same path, was measured: rmcases.py)."""
    with uvm_file() as fd, reserved(POOL_BYTES) as pool:
        assert alloc_pool(fd, pool) == NvStatus.NV_OK
        assert map_uvm(fd, pool, POOL_BYTES) == 0
        assert free(fd, pool) == NvStatus.NV_ERR_INVALID_ARGUMENT
        assert libc.munmap(pool, POOL_BYTES // 2) == 0
        assert free(fd, pool) == NvStatus.NV_OK
        assert objects()["uvm_ranges"] == 0
        assert libc.munmap(pool + POOL_BYTES // 2, POOL_BYTES // 2) == 0
