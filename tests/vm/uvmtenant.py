"""A CUDA-shaped user of /dev/nvidia-uvm for the VM tests, run inside a cgroup.

It does what libcuda did on an H100 (BENCHMARKS.md, 2026-11-27, eleventh session): at start-up
UVM_INITIALIZE, then UVM_ALLOC_SEMAPHORE_POOL of 2 MiB and an mmap of exactly that range; for
cuMemAllocManaged one shared, fixed mmap of the UVM file with offset == address and no ioctl.
It prints one JSON object: RM statuses, errnos, whether what was mapped can be written, and how
many UVM ranges nvmock holds while the mappings live.

    python -m tests.vm.uvmtenant MIB     a managed range of MIB MiB, written at both ends if made
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.vm.nvmock import objects
from tests.vm.uvmcalls import (
    POOL_BYTES,
    alloc_pool,
    free,
    initialize,
    libc,
    map_uvm,
    reserve,
    uvm_file,
    writes,
)


def main(mib: int) -> dict[str, Any]:
    size = mib << 20
    report: dict[str, Any] = {}
    with uvm_file() as fd:
        pool = reserve(POOL_BYTES)
        report["before_init"] = map_uvm(fd, pool, POOL_BYTES)  # EBADFD: nothing before INIT
        report["init"] = initialize(fd)
        report["pool"] = alloc_pool(fd, pool)
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
        report["free"] = free(fd, pool)
    return report


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
