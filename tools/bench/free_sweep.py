"""What an RM_FREE costs in a client shaped as libcuda's, run inside the VM by qgpu_vm.py.

libcuda's client holds four TSGs and 20 channels (tools/gpuload/CUDA_SEQUENCE.md: a compute
TSG with a context share and 8 channels, three copy-engine TSGs in legacy mode with 4 each),
each channel with a 4 KiB system-memory error notifier. After a free that may have destroyed
TSGs or channels as its dependents, qgpu asks RM about each TSG and channel of the client
(kmod/qgpu/ioctl.c: untrack_dependents()), one kernel control each. This times pairs of
RM_ALLOC + RM_FREE in such a client, of system memory as a notifier is (no dependents) and of
a VA space (TSGs and shares may depend on one), and counts the kernel controls nvmock served
meanwhile (debugfs kapi): qgpu's questions, which on a host go to RM.

    python -m tools.bench.free_sweep [PAIRS]    prints one JSON object
"""

from __future__ import annotations

import json
import sys
import time

from qpolicy.nvrm import abi
from tests.vm import rmcases
from tests.vm.rmclient import Rm, sysmem_params
from tests.vm.test_qgpu_rmapi import kapi

COMPUTE_CHANNELS, COPY_TSGS, COPY_CHANNELS = 8, 3, 4
TSGS, CHANNELS = 1 + COPY_TSGS, COMPUTE_CHANNELS + COPY_TSGS * COPY_CHANNELS


def kernel_controls() -> int:
    return kapi()[0]["controls"]


def cuda_shaped(s: rmcases.Scope) -> None:
    """libcuda's TSGs and channels in the scope's client, made by rmcases' builders as libcuda
    makes them (the channels kept off the runlist), a notifier for each channel."""

    def channel(tsg: int, engine: int, share: int = 0) -> None:
        s.rm.new(s.client, s.device, 0x3E, sysmem_params(4096))
        rmcases._channel(s, tsg, engine, share)

    vaspace = s.rm.new(s.client, s.device, 0x90F1, bytes(56))
    tsg = rmcases._tsg(s, rmcases.GR)
    share = rmcases._share(s, tsg, vaspace, abi.SUBCONTEXT_ASYNC)[1]
    for _ in range(COMPUTE_CHANNELS):
        channel(tsg, rmcases.GR, share)
    for copy in range(COPY_TSGS):
        engine = rmcases.COPY2 + copy
        copy_tsg = rmcases._tsg(s, engine, vaspace)
        for _ in range(COPY_CHANNELS):
            channel(copy_tsg, engine)


def pairs(s: rmcases.Scope, n: int, cls: int, params: bytes) -> dict[str, float]:
    """``n`` RM_ALLOC + RM_FREE of one class under the device: ns and kernel controls a pair."""
    controls = kernel_controls()
    started = time.perf_counter_ns()
    for _ in range(n):
        handle = s.rm.new(s.client, s.device, cls, params)
        status = s.rm.free(s.client, s.device, handle)
        if status:
            raise RuntimeError(f"RM_FREE of class {cls:#x}: status {status:#x}")
    elapsed = time.perf_counter_ns() - started
    return {"ns": elapsed / n, "kernel_controls": (kernel_controls() - controls) / n}


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rm = Rm(0)
    try:
        with rmcases.scope(rm, va_mode=2) as s:
            cuda_shaped(s)
            out = {
                "pairs": n,
                "tsgs": TSGS,
                "channels": CHANNELS,
                "sysmem": pairs(s, n, 0x3E, sysmem_params(4096)),
                "vaspace": pairs(s, n, 0x90F1, bytes(56)),
            }
    finally:
        rm.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
