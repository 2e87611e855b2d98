"""What the rm enforcer's looks for processes no probe saw cost the daemon's loop thread
(qpolicy/enforcers/rm/unseen.py), on a node where one pod's tenant made many cgroups.

The tree is the annotations bench's tenant tree (tools/bench/annotations.py): a 100-pod node
shaped as Kubernetes makes it, and in one pod's container ``TENANT_CGROUPS`` cgroups of its own
(40 files each), on tmpfs, every cgroup with an empty ``cgroup.procs``: the walk is what a tenant
can make grow, so no process is checked. Every one of the 100 pods is configured (looked
through). The loop refreshes every 0.1 s (its tick, moved by a simulated clock; the CPU is real,
the calling thread's ``time.thread_time``) for two minutes:

* ``look whole, every 10 s``: the look as the rm enforcer ran it before 2026-12-07 (fifty-ninth
  session): all of it in one refresh, every 10 s (``UnseenProcesses.look``, today's walk given no
  deadline, on the backend's schedule of then), reported beside the other, not judged;
* ``look in slices``: ``UnseenProcesses.refresh`` every tick, as the backend calls it now (at most
  ``LOOK_SLICE_S`` a refresh, looks spaced to ``LOOK_SHARE`` of a core).

``longest_refresh_ms``: the most CPU one refresh took, how long it held the loop thread that hands
the GPUs over; ``cpu_percent``: all refreshes' CPU over the two simulated minutes. Targets, as for
the annotation watch's tenant rows: a refresh at most 5 ms, the looks at most 1.5 % of a core.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from qpolicy.enforcers.rm.unseen import LOOK_EVERY_S, UnseenProcesses
from qpolicy.nvrm.tracker import Tracker
from tools.bench import annotations
from tools.bench.common import SimClock, tmpfs_dir

SECONDS = 120
TARGET_REFRESH_MS = annotations.TARGET_REFRESH_MS
TARGET_PERCENT = annotations.TARGET_TENANT_PERCENT
PODS = 100


def measure(root: Path, sliced: bool) -> dict[str, Any]:
    """Two simulated minutes of the daemon's refreshes, looking through the node's pods."""
    clock = SimClock()
    tracker = Tracker()
    unseen = UnseenProcesses(
        lambda: tracker,
        lambda: root,
        lambda pid: None,
        clock,
        newest=lambda: None,  # no /dev/nvidiactl here: no client of the daemon's own
        client_check=lambda: None,
    )
    pods = [f"/kubepods.slice/kubepods-pod{index}.slice" for index in range(PODS)]
    looked_at: float | None = None
    longest = total = 0.0
    try:
        for _ in range(SECONDS * 10):
            clock.now += 0.1
            start = time.thread_time()
            if sliced:
                unseen.refresh(lambda: pods)
            elif looked_at is None or clock.now - looked_at >= LOOK_EVERY_S:
                looked_at = clock.now
                unseen.look(pods)
            spent = time.thread_time() - start
            longest, total = max(longest, spent), total + spent
    finally:
        unseen.close()
    return {
        "cgroups": unseen.cgroups,
        "looks": unseen.looks,
        "longest_refresh_ms": round(longest * 1e3, 2),
        "cpu_percent": round(100 * total / SECONDS, 3),
        "look_ms": round(unseen.look_cost_s * 1e3, 1),
        "look_every_s": round(unseen.look_every_s if sliced else LOOK_EVERY_S, 1),
    }


def run() -> dict[str, Any]:
    with tmpfs_dir("qpolicy-bench-unseen-") as tmp:
        root = tmp / "tenant"
        annotations._tenant_tree(root)
        try:
            before = measure(root, sliced=False)
            row = measure(root, sliced=True)
        finally:
            shutil.rmtree(root)
    row["meets_target"] = (
        row["longest_refresh_ms"] <= TARGET_REFRESH_MS and row["cpu_percent"] <= TARGET_PERCENT
    )
    return {
        "target_refresh_ms": TARGET_REFRESH_MS,
        "target_percent": TARGET_PERCENT,
        "scenarios": {"look in slices": row},
        # The way before, beside it from the same run; not judged (it is what the target is for).
        "before": {"look whole, every 10 s": before},
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
