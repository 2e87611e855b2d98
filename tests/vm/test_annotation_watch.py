"""The annotation watch on a real cgroup v2 mount (the VM's kernel): cgroupfs's mkdir, rmdir and
setxattr reach inotify, and a process moving between cgroups (a write to cgroup.procs, the
kernel's notification on cgroup.events) wakes nothing. tests/unit/test_annotation_watch.py holds
the watch to a walk on an ordinary filesystem."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpolicy.desired.annotations import scan
from qpolicy.desired.annotationwatch import AnnotationWatch
from qpolicy.model import PodClass, PodSpec
from tests.annotated_tree import record_watch_walks
from tests.vm.qgpu_env import CGROUP_ROOT, cgroup_tree


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return record_watch_walks(monkeypatch)


@pytest.fixture
def slice_() -> Iterator[Path]:
    with cgroup_tree("qpolicy-watch") as path:
        yield path


def test_cgroupfs_changes_reach_the_watch_and_nothing_else_wakes_it(
    slice_: Path, walks: list[str]
) -> None:
    # Time does not move for the watch: every refresh finishes its work (slices: the unit tests).
    watch = AnnotationWatch(CGROUP_ROOT, timer=lambda: 0.0)
    try:
        assert watch.unwatched is None and watch.watches >= 2
        assert walks[0] == str(CGROUP_ROOT) and str(slice_) in walks
        walked = len(walks)
        rel = "/" + slice_.name
        pod = slice_ / "pod-web"
        (pod / "ctr").mkdir(parents=True)  # a pod and its container, as the kubelet makes them
        os.setxattr(pod, "user.qpolicy.class", b"online")
        os.setxattr(pod, "user.qpolicy.share", b"30")
        assert watch.refresh() is True
        assert watch.annotations.pods[f"{rel}/pod-web"] == PodSpec(
            f"{rel}/pod-web", 0, PodClass.ONLINE, 30
        )
        assert walks[walked:] == [str(pod), str(pod / "ctr")]
        # A process moved in and out: cgroup.procs written, cgroup.events notified.
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            (pod / "ctr" / "cgroup.procs").write_text(f"{sleeper.pid}\n")
            (slice_ / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        finally:
            sleeper.kill()
            sleeper.wait()
        assert watch.refresh() is False
        os.setxattr(pod, "user.qpolicy.share", b"150")
        assert watch.refresh() is True
        assert f"{rel}/pod-web" not in watch.annotations.pods
        assert "invalid share '150'" in watch.annotations.errors[f"{rel}/pod-web"]
        (pod / "ctr").rmdir()
        pod.rmdir()
        assert watch.refresh() is True
        assert not any(
            p.startswith(rel) for p in (*watch.annotations.pods, *watch.annotations.errors)
        )
        assert len(walks) == walked + 2  # nothing listed but the new pod
        assert watch.annotations == scan(CGROUP_ROOT)
    finally:
        watch.close()
