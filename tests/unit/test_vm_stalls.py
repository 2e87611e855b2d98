"""tools/bench/vm_stalls.py: the VM's own stalls, as `make bench-vm` reports them beside its
online rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tools.bench import vm_stalls
from tools.bench.vm_stalls import BadCanary, describe, summarize


def test_a_stall_is_a_wake_over_two_and_a_half_ms_late_and_all_over_one_are_kept() -> None:
    s = summarize({"wakes": 5000, "late_ms": [3.1, 1.2, 7.96, 2.5]}, seconds=10)
    assert (s["wakes"], s["late_over_1ms"], s["stalls_over_2_5ms"]) == (5000, 4, 2)
    assert s["max_late_ms"] == 7.96 and s["late_ms"] == [1.2, 2.5, 3.1, 7.96]
    line = describe(s)
    assert "late 2 times in 5000 (latest 8.0 ms)" in line and "not a target" in line


def test_a_quiet_vm_has_no_stall_and_a_latest_of_zero() -> None:
    s = summarize({"wakes": 4900, "late_ms": []})
    assert (s["stalls_over_2_5ms"], s["max_late_ms"], s["seconds"]) == (0, 0.0, vm_stalls.SECONDS)


@pytest.mark.parametrize(
    ("report", "words"),
    [
        ({"wakes": 0, "late_ms": []}, "canary wakes 0"),
        ({"late_ms": []}, "canary wakes None"),
        ({"wakes": 9, "late_ms": ["x"]}, "late_ms ['x']"),
        ({"wakes": 9}, "late_ms None"),
    ],
)
def test_a_report_that_is_not_the_canarys_is_named(report: dict[str, object], words: str) -> None:
    with pytest.raises(BadCanary, match=words.replace("[", r"\[").replace("]", r"\]")):
        summarize(report)


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root")
def test_the_canary_reports_its_wakes_and_what_it_kept() -> None:
    """The canary itself, for a fifth of a second on this machine: it wakes about every 2 ms and
    keeps only the wake-ups over 1 ms late."""
    done = subprocess.run(
        [sys.executable, "-c", vm_stalls.CANARY, "0.2", "0.002", "1.0"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    assert 20 <= report["wakes"] <= 100
    assert all(ms > 1.0 for ms in report["late_ms"])
    assert summarize(report, 0.2)["wakes"] == report["wakes"]
