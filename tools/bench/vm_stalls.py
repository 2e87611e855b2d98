"""How often the VM itself stops: the context for `make bench-vm`'s online p99.

The VM is QEMU's TCG on two shared cores. In a traced run on 2026-12-05 (BENCHMARKS.md,
fortieth session) four of the online stream's six slow requests held a stretch of 2.7-4.4 ms in
which one thread (nvmock's engine, the online process itself, or the idle task) kept the vCPU
without a switch, where its runs are otherwise under 0.5 ms: the signature of the vCPU not
running. A thread of the highest SCHED_FIFO priority that sleeps STEP_S at a time wakes late
only when the vCPU does not run, and in an idle VM it woke over 2.5 ms late 4-9 times in 20 s
in four boots, one of them with the vCPU's host thread alone on a core
(tools/bench/results/2026-12-05-vm-stalls-experiments.json). A run's p99, the 10th slowest of
1 001 requests, falls where such stalls begin, so `make bench-vm` counts them in the idle VM
before its online rows: a verdict beside many stalls is read with them. It is reported, not a
target.

The canary runs alone: beside the online rows a thread waking 500 times a second at the top
priority (Python, in TCG) took the online p99 to 7.2 ms.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

SECONDS = 10.0
STEP_S = 0.002
# Lateness kept in the raw result (every wake-up later than this), and the one counted as a
# stall: a 2 ms request with 2.5 ms more is past 1.5 x any solo p99 seen in the VM.
KEEP_MS = 1.0
STALL_MS = 2.5

CANARY = """
import json, os, sys, time
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99))
seconds, step, keep = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + seconds
wakes, late = 0, []
while time.monotonic() < end:
    t = time.monotonic()
    time.sleep(step)
    ms = (time.monotonic() - t - step) * 1000
    wakes += 1
    if ms > keep:
        late.append(round(ms, 3))
print(json.dumps({"wakes": wakes, "late_ms": late}))
"""


class BadCanary(ValueError):
    """What the canary printed is not its report."""


def summarize(report: dict[str, Any], seconds: float = SECONDS) -> dict[str, Any]:
    """The canary's report as the bench keeps it: wake-ups, those over KEEP_MS and STALL_MS late,
    the latest, and every kept lateness."""
    wakes, late = report.get("wakes"), report.get("late_ms")
    if not isinstance(wakes, int) or wakes <= 0:
        raise BadCanary(f"canary wakes {wakes!r}: not a positive count")
    if not isinstance(late, list) or not all(isinstance(ms, int | float) for ms in late):
        raise BadCanary(f"canary late_ms {late!r}: not a list of milliseconds")
    return {
        "seconds": seconds,
        "step_ms": STEP_S * 1000,
        "wakes": wakes,
        "late_over_1ms": len(late),  # the canary keeps only those
        "stalls_over_2_5ms": sum(ms > STALL_MS for ms in late),
        "max_late_ms": max(late, default=0.0),
        "late_ms": sorted(late),
    }


def describe(stalls: dict[str, Any]) -> str:
    """One line for the bench's output."""
    return (
        f"VM stalls, idle, {stalls['seconds']:g} s: a SCHED_FIFO thread sleeping "
        f"{stalls['step_ms']:g} ms woke over {STALL_MS:g} ms late {stalls['stalls_over_2_5ms']} "
        f"times in {stalls['wakes']} (latest {stalls['max_late_ms']:.1f} ms): the online p99 "
        "falls among such stalls (reported, not a target)"
    )


def measure(seconds: float = SECONDS) -> dict[str, Any]:
    """Run the canary in this (idle) VM for ``seconds``; needs root for SCHED_FIFO."""
    done = subprocess.run(
        [sys.executable, "-c", CANARY, str(seconds), str(STEP_S), str(KEEP_MS)],
        capture_output=True,
        text=True,
        check=True,
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as err:
        raise BadCanary(f"canary printed {done.stdout[:80]!r}") from err
    return summarize(report, seconds)
