"""What keeping the cgroup annotations current costs the daemon, by node size: a walk of the
hierarchy every second (the daemon before 2026-12-07) against the inotify watch
(qpolicy/desired/annotationwatch.py) refreshed every second.

The tree has a Kubernetes node's shape: 40 system cgroups, then per pod a pod cgroup and three
container cgroups (the pause container and two), every directory with 60 files as a cgroup v2
directory has control files (a Debian 12 VM's leaf cgroups: 55-70). It lives on tmpfs, not
cgroupfs (no cgroups can be made on this machine); a real mount's walk may cost more or less per
entry. Each way's CPU is the calling thread's (``time.thread_time``) over repeated calls:

* ``walk_per_s_percent``: one scan() a second, as the daemon walked;
* ``watch_idle_per_s_percent``: one refresh() a second with nothing changed (a read of the
  inotify descriptor that finds nothing);
* ``watch_new_pod_ms``: the refresh after a pod cgroup, its three containers and their
  annotation were made (the new subtree walked and read);
* ``watch_start_ms``: the first walk, with a watch added per directory.

Target: the watch's steady cost, with nothing changed, at most 0.01 % of one core at every node
size (the daemon's whole budget is 2 %).

Then a tenant's tree: the 100-pod node with one container holding ``TENANT_CGROUPS`` cgroups of
its own (40 files each: a leaf cgroup's control files), as a pod running systemd or rootless
containers in a delegated subtree can make. The daemon's loop thread refreshes the watch every
0.1 s (its tick, moved by a simulated clock; the CPU is real), for two minutes:

* ``tenant, watched``: an overflowed queue (a flood of the tenant's mkdirs) at the start, and
  the safety walk that comes due within the two minutes;
* ``tenant, walked``: no inotify (``max_user_instances`` taken): every walk.

``longest_refresh_ms`` is the most CPU one refresh took: how long it held the loop thread, whose
hand-overs of the GPUs wait meanwhile. ``cpu_percent`` is the CPU of all refreshes over the two
simulated minutes. Targets: a refresh at most 5 ms, the walks at most 1.5 % of a core.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qpolicy.desired.annotations import scan
from qpolicy.desired.annotationwatch import AnnotationWatch
from qpolicy.runtime.inotify import IN_Q_OVERFLOW, Event, Inotify
from tools.bench.common import SimClock, tmpfs_dir

PODS = (10, 100, 300)
SYSTEM_CGROUPS = 40
CONTAINERS = 3
FILES = 60
TARGET_PERCENT = 0.01
TENANT_CGROUPS = 5000
TENANT_FILES = 40
TENANT_SECONDS = 120
TARGET_REFRESH_MS = 5.0
TARGET_TENANT_PERCENT = 1.5


def _cgroup(path: Path) -> None:
    path.mkdir(parents=True)
    _files(path, FILES)


def _files(path: Path, count: int) -> None:
    """A cgroup's control files, ``cgroup.procs`` among them (empty: no process in it), which
    the rm enforcer's look for unseen processes reads (tools/bench/unseen.py)."""
    (path / "cgroup.procs").touch()
    for index in range(1, count):
        (path / f"control.{index}").touch()


def _pod(root: Path, index: int, annotate: bool) -> None:
    pod = root / "kubepods.slice" / f"kubepods-pod{index}.slice"
    _cgroup(pod)
    for container in range(CONTAINERS):
        _cgroup(pod / f"cri-containerd-{container}.scope")
    if annotate:
        os.setxattr(pod, "user.qpolicy.share", b"10")


def _tree(root: Path, pods: int) -> int:
    _cgroup(root)
    for index in range(SYSTEM_CGROUPS):
        _cgroup(root / "system.slice" / f"unit{index}.service")
    _cgroup(root / "kubepods.slice" / "burstable")
    for index in range(pods):
        _pod(root, index, annotate=index % 10 == 0)
    return sum(1 for _ in os.walk(root))


def _cpu_s(call: Any, repeat: int) -> float:
    """The calling thread's CPU per call, the least of three rounds."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        for _ in range(repeat):
            call()
        best = min(best, (time.thread_time() - start) / repeat)
    return best


def measure(base: Path, pods: int) -> dict[str, Any]:
    root = base / f"tree{pods}"
    directories = _tree(root, pods)
    walk_s = _cpu_s(lambda: scan(root), repeat=max(3, 300 // pods))
    start = time.thread_time()
    watch = AnnotationWatch(root)
    start_s = time.thread_time() - start
    try:
        assert watch.annotations == scan(root) and watch.unwatched is None, watch.unwatched
        idle_s = _cpu_s(watch.refresh, repeat=2000)
        new_pod_s = []
        for extra in range(5):
            _pod(root, pods + extra, annotate=True)
            begin = time.thread_time()
            changed = watch.refresh()
            new_pod_s.append(time.thread_time() - begin)
            assert changed
        assert watch.annotations == scan(root)
    finally:
        watch.close()
        shutil.rmtree(root)
    return {
        "directories": directories,
        "entries": directories * (FILES + 1),
        "walk_ms": round(walk_s * 1e3, 3),
        "walk_per_s_percent": round(100 * walk_s, 3),
        "watch_start_ms": round(start_s * 1e3, 2),
        "watch_idle_us": round(idle_s * 1e6, 2),
        "watch_idle_per_s_percent": round(100 * idle_s, 5),
        "watch_new_pod_ms": round(1e3 * sorted(new_pod_s)[len(new_pod_s) // 2], 3),
    }


class _OverflowOnce(Inotify):
    """Real inotify whose first read reports that the queue overflowed."""

    def __init__(self) -> None:
        super().__init__()
        self.overflowed = False

    def read_some(self) -> list[Event]:
        events = super().read_some()
        if self.overflowed:
            return events
        self.overflowed = True
        return [*events, Event(-1, IN_Q_OVERFLOW, 0, "")]


def _refused() -> Inotify:
    raise OSError(24, "Too many open files")


def _tenant_tree(root: Path) -> int:
    _tree(root, 100)
    tenant = root / "kubepods.slice" / "kubepods-pod1.slice" / "cri-containerd-0.scope"
    for index in range(TENANT_CGROUPS):
        group = tenant / f"group{index // 100}" / f"leaf{index}"
        group.mkdir(parents=True)
        _files(group, TENANT_FILES)
    return sum(1 for _ in os.walk(root))


def measure_tenant(root: Path, inotify: Callable[[], Inotify]) -> dict[str, float]:
    """Two simulated minutes of the daemon's refreshes of ``root``'s watch."""
    clock = SimClock()
    watch = AnnotationWatch(root, clock=clock, inotify=inotify)
    try:
        longest = total = 0.0
        for _ in range(TENANT_SECONDS * 10):
            clock.now += 0.1
            start = time.thread_time()
            watch.refresh()
            spent = time.thread_time() - start
            longest, total = max(longest, spent), total + spent
        assert watch.annotations == scan(root)
    finally:
        watch.close()
    return {
        "longest_refresh_ms": round(longest * 1e3, 2),
        "cpu_percent": round(100 * total / TENANT_SECONDS, 3),
    }


def tenant(base: Path) -> dict[str, dict[str, Any]]:
    root = base / "tenant"
    directories = _tenant_tree(root)
    try:
        rows = {
            "tenant, watched": measure_tenant(root, _OverflowOnce),
            "tenant, walked": measure_tenant(root, _refused),
        }
    finally:
        shutil.rmtree(root)
    for row in rows.values():
        row["directories"] = directories
        row["meets_target"] = (
            row["longest_refresh_ms"] <= TARGET_REFRESH_MS
            and row["cpu_percent"] <= TARGET_TENANT_PERCENT
        )
    return rows


def run() -> dict[str, Any]:
    with tmpfs_dir("qpolicy-bench-annotations-") as tmp:
        try:
            os.setxattr(tmp, "user.qpolicy.x", b"1")
        except OSError as error:
            return {"skipped": f"{tmp} takes no user.* extended attributes ({error.strerror})"}
        scenarios = {f"{pods} pods": measure(tmp, pods) for pods in PODS}
        for row in scenarios.values():
            row["meets_target"] = row["watch_idle_per_s_percent"] <= TARGET_PERCENT
        scenarios.update(tenant(tmp))
    return {
        "target_percent": TARGET_PERCENT,
        "target_refresh_ms": TARGET_REFRESH_MS,
        "target_tenant_percent": TARGET_TENANT_PERCENT,
        "scenarios": scenarios,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
