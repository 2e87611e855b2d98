"""tools/gpu/host_noise.py: the host sampler finds a process that spins beside a measurement."""

from __future__ import annotations

import subprocess
import sys

from tools.gpu import host_noise


def test_a_process_spinning_beside_is_named_with_its_share_of_a_core() -> None:
    spin = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        result = host_noise.sample(1.0, 0.25, 0.02, exclude=set())
        ignored = host_noise.sample(0.5, 0.25, 0.02, exclude={child.pid})
    finally:
        child.kill()
        child.wait()
    seen = [p["cores"] for s in result["samples"] for p in s["processes"] if p["pid"] == child.pid]
    assert len(seen) >= 3 and min(seen) > 0.5, result
    assert all(0.0 <= s["busy"] <= 1.0 for s in result["samples"])
    assert not any(p["pid"] == child.pid for s in ignored["samples"] for p in s["processes"])
