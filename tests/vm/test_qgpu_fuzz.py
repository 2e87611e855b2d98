"""Bad input through qgpu: random ioctls and mmaps from a gated, memory-limited cgroup, while a
process of CUDA's tree (gpuload --tree cuda) runs in a gated cgroup beside it. Nothing may
oops or warn, the CUDA-shaped process keeps running and getting its share, and once the fuzzer
is gone its cgroup is charged nothing and RM holds nothing of it. tests/vm/test_nvmock_fuzz.py
fuzzes nvmock alone, and tests/vm/test_qgpu_control.py qgpu's netlink interface."""

from __future__ import annotations

import subprocess
import sys

from tests.vm.nvmock import BAD_KERNEL_LOG, ROOT, kernel_log, objects, reset
from tests.vm.qgpu_env import cgroups, in_cgroup, qgpu_loaded, stats_of

CUDA_SATURATE = [
    "--tree",
    "cuda",
    "--shape",
    "saturate",
    "--kernel-us",
    "500",
    "--sync-every",
    "4",
    "--queue",
    "4",
]
PERIOD_US = 50_000
MIB = 1 << 20

# The fuzzer, in its own process (so that it can be put in a cgroup): tests/vm/test_nvmock_fuzz.py's
# objects and loop, with a seed of its own. It prints how many calls failed.
FUZZER = """
from tests.vm.test_nvmock_fuzz import fuzz_process
import sys
print(sum(fuzz_process(int(sys.argv[1])).values()))
"""


def test_random_ioctls_from_a_gated_cgroup_beside_a_cuda_shaped_process() -> None:
    reset()
    before = objects()
    with qgpu_loaded() as client, cgroups(2) as (work_cg, fuzz_cg):
        client.set_gpu(0, "fixed-share", PERIOD_US)
        client.set_cgroup(work_cg.id, 0, "offline", 50, mem_limit=256 * MIB)
        client.set_cgroup(fuzz_cg.id, 0, "offline", 50, mem_limit=64 * MIB)
        work = in_cgroup(work_cg, [*CUDA_SATURATE, "--seconds", "20"]).ready()
        fuzzer = subprocess.run(
            [sys.executable, "-c", FUZZER, "20261126"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            preexec_fn=lambda: (fuzz_cg.path / "cgroup.procs").write_text("0"),
        )
        result = work.result()
        assert fuzzer.returncode == 0, fuzzer.stderr[-2000:]
        assert int(fuzzer.stdout.split()[-1]) > 0  # something was refused
        bad = [line for line in kernel_log().splitlines() if BAD_KERNEL_LOG.search(line)]
        assert not bad, "\n".join(bad)
        # The CUDA-shaped process ran throughout, through qgpu's gates and turns.
        assert result["tree"] == "cuda" and result["kernels"] > 0
        assert stats_of(client, work_cg).nr_periods > 0
        # Nothing of the fuzzer's is left charged.
        assert stats_of(client, fuzz_cg).mem_used == 0
        assert objects()["vidmem"] == before["vidmem"]
    # Nor held by RM, once qgpu (and its own kernel client) is gone too.
    assert objects() == before
