"""`make bench-gpu`'s mode qpolicy-annotated (tools/gpu/annotated_pods.py): the annotations it
writes are the pods the daemon's own reader makes of them, it waits for the daemon's status to
list them, and a real daemon (no probe, nothing enforced, a cgroup root of plain directories)
learns the bench's pods from them alone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from qpolicy.desired.annotations import annotation_of
from qpolicy.model import PodClass, PodSpec
from tests.annotated_tree import Clock, xattr_root
from tools.bench import gpu
from tools.gpu import annotated_pods

TRAINER_8192 = next(s for s in gpu.SCENARIOS if s.name.startswith("online") and "8192" in s.name)


@pytest.mark.parametrize(
    "spec",
    [
        PodSpec("/kubepods.slice/infer", 0, PodClass.ONLINE, 20),
        PodSpec("/kubepods.slice/train", 1, PodClass.OFFLINE, None, 8 * 2**30),
    ],
)
def test_what_the_bench_writes_is_the_pod_the_daemon_reads(tmp_path: Path, spec: PodSpec) -> None:
    directory = xattr_root(tmp_path / "pod")
    annotated_pods.annotate(directory, spec)
    assert annotation_of(str(directory), spec.id) == spec
    names = set(os.listxattr(directory))
    assert names == set(annotated_pods.attributes(spec))
    assert (annotated_pods.PREFIX + "share" in names) is (spec.share is not None)


def test_unannotate_takes_off_the_qpolicy_annotations_alone(tmp_path: Path) -> None:
    directory = xattr_root(tmp_path / "pod")
    os.setxattr(directory, "user.other", b"kept")
    annotated_pods.annotate(directory, PodSpec("/pod", 0, PodClass.ONLINE, 20))
    annotated_pods.unannotate(directory)
    assert os.listxattr(directory) == ["user.other"]
    annotated_pods.unannotate(directory)  # nothing left to take: no error
    annotated_pods.unannotate(tmp_path / "gone")  # nor for a cgroup removed meanwhile


def _status(path: Path, pods: dict[str, str]) -> None:
    path.write_text(json.dumps({"pods": [{"id": p, "class": c} for p, c in pods.items()]}))


def test_it_waits_until_the_status_lists_every_pod_with_its_class(tmp_path: Path) -> None:
    status = tmp_path / "daemon-status.json"
    specs = [PodSpec("/b/online", 0, PodClass.ONLINE), PodSpec("/b/trainer", 0, PodClass.OFFLINE)]
    clock = Clock()
    # What the daemon writes poll by poll: nothing yet, one pod, the other with another class
    # (its class annotation not read yet), then both as asked.
    writes = [
        None,
        {"/b/online": "online"},
        {"/b/online": "online", "/b/trainer": "online"},
        {"/b/online": "online", "/b/trainer": "offline", "/other": "unmanaged"},
    ]

    def sleep(seconds: float) -> None:
        clock.now += seconds
        step = writes.pop(0)
        if step is not None:
            _status(status, step)

    took = annotated_pods.wait_until(status, specs, listed=True, clock=clock, sleep=sleep)
    assert took == pytest.approx(4 * annotated_pods.POLL_S)
    assert writes == []


def test_a_pod_is_dropped_once_no_class_is_listed_for_it(tmp_path: Path) -> None:
    """Annotations taken off: the pod may stay listed as an unmanaged cgroup (its processes
    still hold the GPU), never as a pod of a class."""
    status = tmp_path / "daemon-status.json"
    specs = [PodSpec("/b/online", 0, PodClass.ONLINE), PodSpec("/b/trainer", 0, PodClass.OFFLINE)]
    clock = Clock()
    writes = [
        {"/b/online": "online", "/b/trainer": "offline"},
        {"/b/online": "unmanaged", "/b/trainer": "offline"},
        {"/b/online": "unmanaged"},
    ]
    _status(status, writes.pop(0))

    def sleep(seconds: float) -> None:
        clock.now += seconds
        _status(status, writes.pop(0))

    took = annotated_pods.wait_until(status, specs, listed=False, clock=clock, sleep=sleep)
    assert took == pytest.approx(2 * annotated_pods.POLL_S)
    assert writes == []
    # Still a pod (of another class than asked, too): not dropped.
    _status(status, {"/b/trainer": "online"})
    writes.extend([{"/b/trainer": "online"}] * 20)
    took = annotated_pods.wait_until(
        status, specs, listed=False, timeout_s=0.5, clock=clock, sleep=sleep
    )
    assert took is None


def test_a_daemon_that_never_lists_them_is_reported_not_waited_for(tmp_path: Path) -> None:
    status = tmp_path / "daemon-status.json"
    _status(status, {"/b/online": "offline"})
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    specs = [PodSpec("/b/online", 0, PodClass.ONLINE)]
    took = annotated_pods.wait_until(
        status, specs, listed=True, timeout_s=1.0, clock=clock, sleep=sleep
    )
    assert took is None and clock.now == pytest.approx(1.0)
    status.write_text("{not json")
    assert annotated_pods.status_pods(status) == {}
    assert annotated_pods.watch_status(status) is None


@pytest.mark.parametrize("annotated", [True, False])
def test_the_running_daemon_learns_the_bench_pods_from_annotations_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, annotated: bool
) -> None:
    """The bench's daemon with a state file of the GPU alone, told of the pods by what the bench
    writes on their cgroups: a real `qpolicy daemon` (no probe, nothing enforced) lists them
    with their classes, watching the hierarchy; afterwards the annotations are gone."""
    root = xattr_root(tmp_path / "cgroup")
    monkeypatch.setattr(gpu, "cgroup2_mount", lambda: root)
    # No probe here: the daemon's metrics answering is enough to go on.
    monkeypatch.setattr(gpu, "probe_up", lambda port: True)
    monkeypatch.setattr(gpu, "DAEMON_ARGS", ["--probe", "off", "--cgroup-root", str(root)])
    monkeypatch.setattr(gpu, "STRATEGY", ["default"])
    cgroups = gpu.Cgroups(root=root / "qpolicy-bench")
    pods = gpu.desired_pods(TRAINER_8192, cgroups)
    assert {p.pod_class for p in pods} == {PodClass.ONLINE, PodClass.OFFLINE}
    with gpu.qpolicy_daemon(TRAINER_8192, cgroups, enforcer="none", annotated=annotated) as info:
        state_dir = Path(info["status_path"]).parent
        if not annotated:  # told by its state file: listed once it has read it
            assert (
                annotated_pods.wait_until(Path(info["status_path"]), pods, listed=True) is not None
            )
        stored = json.loads((state_dir / "state.json").read_text())
        listed = annotated_pods.status_pods(Path(info["status_path"]))
        written = {p.id: sorted(os.listxattr(cgroups.path(p.id.rsplit("/", 1)[1]))) for p in pods}
    assert info["exit_code"] == 0
    if annotated:
        assert not _stored_pods(stored)
        assert written == {p.id: sorted(annotated_pods.attributes(p)) for p in pods}
        assert info["annotations_listed_after_s"] is not None
        # Taken off after the run, the daemon let the pods go.
        assert info["annotations_dropped_after_s"] is not None
        assert info["annotations"]["watched_directories"] >= len(pods) + 2
    else:
        assert len(_stored_pods(stored)) == len(pods)
        assert written == {p.id: [] for p in pods}
        assert "annotations_listed_after_s" not in info
        assert "annotations_dropped_after_s" not in info
    assert listed == {p.id: str(p.pod_class) for p in pods}
    assert all(os.listxattr(cgroups.path(p.id.rsplit("/", 1)[1])) == [] for p in pods)


def _stored_pods(stored: dict[str, Any]) -> list[Any]:
    pods = stored.get("pods", {})
    return list(pods.values() if isinstance(pods, dict) else pods)


def test_the_table_says_how_each_annotated_run_learnt_its_pods() -> None:
    report = {
        "scenarios": {
            TRAINER_8192.name: [
                {"mode": "qpolicy", "n": 4096, "daemon": {}},
                {
                    "mode": "qpolicy-annotated",
                    "n": 4096,
                    "daemon": {
                        "annotations_listed_after_s": 0.714,
                        "annotations_dropped_after_s": 1.02,
                        "annotations": {"watched_directories": 31},
                    },
                },
                {
                    "mode": "qpolicy-annotated",
                    "n": 4096,
                    "daemon": {
                        "annotations_listed_after_s": None,
                        "annotations": {"walked": "no inotify instance (Too many open files)"},
                    },
                },
            ]
        }
    }
    assert gpu.annotation_lines(report) == [
        "",
        f"- {TRAINER_8192.name}, n=4096: pods by annotations listed after 0.71 s, dropped 1.02"
        " s after they were taken off, watched (31 directories)",
        f"- {TRAINER_8192.name}, n=4096: pods by annotations not listed in time, walked: no"
        " inotify instance (Too many open files)",
    ]
    assert gpu.annotation_lines({"scenarios": {TRAINER_8192.name: [{"mode": "qpolicy"}]}}) == []
