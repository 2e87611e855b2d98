"""tools/gpu/host_noise.py: the host sampler finds a process that spins beside a measurement."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

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


def test_time_the_hypervisor_took_is_reported_as_steal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest whose CPUs were runnable for 100 ticks of which the hypervisor ran something else
    for 30: steal 0.3 of the interval, counted in busy too (the CPU was not idle)."""
    counters = iter(
        [
            {"user": 0, "system": 0, "idle": 0, "iowait": 0, "softirq": 0, "steal": 0},
            {"user": 40, "system": 10, "idle": 20, "iowait": 0, "softirq": 0, "steal": 30},
        ]
    )

    def host_times() -> dict[str, int]:
        return next(counters)

    monkeypatch.setattr(host_noise, "host_times", host_times)
    monkeypatch.setattr(host_noise, "process_times", dict)
    result = host_noise.sample(0.01, 0.01, 0.02, exclude=set())
    (only,) = result["samples"]
    assert only["steal"] == 0.3
    assert only["busy"] == 0.8


def test_steal_watch_counts_the_samples_the_hypervisor_took_cpu_in() -> None:
    """`make bench-gpu` keeps it with every run (tools/bench/gpu.py run_once())."""
    readings = iter([0, 0, 2, 2, 5])

    def steal_ticks() -> int:
        return next(readings, 5)

    watch = host_noise.StealWatch(interval=0.01, read=steal_ticks)
    with watch:
        while len(watch.samples) < 6:
            time.sleep(0.01)
    everything = watch.within(0, time.time())
    assert everything["samples"] == len(watch.samples) >= 6
    assert everything["with_steal"] == 2  # 0->2 and 2->5; every later sample reads 5 again
    assert everything["steal_cpu_s"] == pytest.approx(5 / host_noise.TICK)
    first_end = watch.samples[0][0]
    assert watch.within(first_end, first_end)["samples"] == 1
    assert watch.within(0, first_end - 1)["samples"] == 0
