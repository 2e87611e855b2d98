"""The VM tier: nvmock.ko loaded with two GPUs, device nodes made as nvidia-modprobe would.

Every test module shares one load of the driver; after each test the driver must hold no
objects, and the kernel log must show no warning, oops or BUG from the whole run. What the tests
read of nvmock is tests/vm/nvmock.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vm.nvmock import BAD_KERNEL_LOG, GPUS, kernel_log, load, make_nodes, objects, unload

# One rerun for a test whose numbers are as much the host's as the code's: the VM is emulated
# (TCG) on two shared cores, and while the host takes them away the VM's processes run far
# slower than its clock. In CI's run at e249b79 three such tests failed at once: a lone
# saturating gpuload kept 0.18 of the engine (over 0.9 in every other run), a saturating pod
# 0.745 of its alone beside a quiet one (0.90-0.93), and 1 000 renamed RM_ALLOCs never once
# met their renaming process. At a24da00, fixed-share 50/30/20 with 3 ms switches gave the
# 20 % pod 17.83 (18.90-19.70 in five runs here). What breaks the code fails both attempts; a
# rerun shows in the summary as R, with the first attempt's failure. Since 2026-12-04 the files
# of qgpu's shares and latencies (the Makefile's VM_TIMED) run in a VM of one vCPU, where a
# lone request stream is stable; the host can still take its core, so they keep the rerun.
HOST_TIMED = pytest.mark.flaky(reruns=1)


@pytest.fixture(scope="session", autouse=True)
def driver() -> Iterator[None]:
    if not Path("/sys/kernel/debug/tracing").exists():
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
    load(num_gpus=GPUS)
    make_nodes()
    yield
    unload()
    bad = [line for line in kernel_log().splitlines() if BAD_KERNEL_LOG.search(line)]
    assert not bad, "\n".join(bad)


@pytest.fixture(autouse=True)
def nothing_leaks() -> Iterator[None]:
    yield
    left = {name: count for name, count in objects().items() if count}
    assert not left, f"objects left behind: {left}"
