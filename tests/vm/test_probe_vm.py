"""The eBPF probe of the telemetry tier, on the VM's kernel, counts exactly the ioctls gpuload
sends to nvmock's major 195 (gpuload counts its own)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from qpolicy.nvrm.abi import Escape
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.probe import NvProbe
from tests.vm.nvmock import GPULOAD


def test_probe_counts_gpuloads_ioctls_exactly() -> None:
    probe = NvProbe(libcuda=None).start()
    cgroup = Path("/sys/fs/cgroup/qpolicy-vm-probe")
    cgroup.mkdir(exist_ok=True)
    try:
        cgroup_id = CgroupMap(root=Path("/sys/fs/cgroup")).id_of("/qpolicy-vm-probe")
        out = subprocess.run(
            ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", str(GPULOAD),
             "--seconds", "1", "--steps", "20"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        sent = {Escape(int(nr, 16)).name: count for nr, count in json.loads(out)["ioctls"].items()}
        seen = probe.counters()[cgroup_id]
        assert dict(seen.escapes) == sent
        assert seen.ioctls == sum(sent.values())
    finally:
        probe.close()
        cgroup.rmdir()
