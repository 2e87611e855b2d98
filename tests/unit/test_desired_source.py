"""The desired state as the daemon reads it: the state file, annotations and other sources,
admitted so that it always plans, with every problem logged once."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from qpolicy.desired.admission import Candidate, Origin, Refusal
from qpolicy.desired.source import DesiredSource
from qpolicy.engine import plan_node
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.state import StateStore
from tests.annotated_tree import Clock, annotate, xattr_root


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    return xattr_root(tmp_path / "cgroup")


def source(tmp_path: Path, cgroups: Path, clock: Clock, **kw: object) -> DesiredSource:
    return DesiredSource(
        StateStore(tmp_path / "state"), cgroup_root=lambda: cgroups, clock=clock, **kw
    )  # type: ignore[arg-type]


def test_oversubscribing_annotations_are_refused_where_they_enter(
    tmp_path: Path, cgroups: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    StateStore(tmp_path / "state").update(lambda s: s.with_gpu(GpuConfig(0, GpuPolicy.FIXED_SHARE)))
    annotate(cgroups / "a", share="60")
    desired = source(tmp_path, cgroups, clock)
    with caplog.at_level(logging.WARNING):
        assert desired.refresh()
        annotate(cgroups / "b", share="60")
        for _ in range(20):  # 20 seconds of ticks: the refusal is logged once
            clock.now += 1.0
            desired.refresh()
    assert list(desired.state.pods) == ["/a"]
    assert desired.refused["/b"].reason == "oversubscribed"
    plan_node(desired.state.gpus, desired.state.pods.values(), {})  # never raises
    assert [r.getMessage() for r in caplog.records] == [
        "pod /b refused: shares on GPU 0 (fixed-share) sum to 120 > 100: /a=60, /b=60"
    ]


def test_the_state_file_wins_over_annotations_of_the_same_cgroup(
    tmp_path: Path, cgroups: Path
) -> None:
    StateStore(tmp_path / "state").update(
        lambda s: s.with_pod(PodSpec("/kube/web", 0, PodClass.OFFLINE, 10))
    )
    annotate(cgroups / "kube" / "web", **{"class": "online", "share": "30"})
    annotate(cgroups / "kube" / "other", **{"class": "online", "share": "20"})
    desired = source(tmp_path, cgroups, Clock())
    desired.refresh()
    assert desired.state.pods["/kube/web"].share == 10
    assert desired.state.pods["/kube/other"].share == 20
    assert desired.refused == {}


def test_unreadable_annotations_are_logged_once_per_cgroup_and_the_rest_is_read(
    tmp_path: Path, cgroups: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    annotate(cgroups / "bad", share=b"\xff\xfe")
    annotate(cgroups / "good", share="10")
    desired = source(tmp_path, cgroups, clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            desired.refresh()
            clock.now += 1.0
    assert list(desired.state.pods) == ["/good"]
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring the annotations of /bad: user.qpolicy.share is not UTF-8 text (b'\\xff\\xfe')"
    ]


def test_a_corrupt_state_file_is_logged_once_and_the_last_good_state_kept(
    tmp_path: Path, cgroups: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = StateStore(tmp_path / "state")
    store.update(lambda s: s.with_pod(PodSpec("/a", 0, share=30)))
    desired = source(tmp_path, cgroups, Clock())
    desired.refresh()
    with caplog.at_level(logging.WARNING):
        store.path.write_text('{"schema": 1, "gpus": {}, "pods": {"/a": {"gpu": "zero"}}}')
        for _ in range(5):
            desired.refresh()
    assert not desired.file.up and "expected an integer" in (desired.file.error or "")
    assert list(desired.state.pods) == ["/a"]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "keeping the last good desired state" in messages[0]
    store.path.unlink()
    store.update(lambda s: s.with_pod(PodSpec("/b", 0)))
    desired.refresh()
    assert desired.file.up and list(desired.state.pods) == ["/b"]


class FakeKube:
    """A pod source the way Kubernetes feeds one."""

    name = "kubernetes"

    def __init__(self, pods: list[Candidate]) -> None:
        self.pods = pods
        self.told: list[Mapping[str, Refusal]] = []
        self.news = True

    @property
    def up(self) -> bool:
        return True

    def refresh(self) -> bool:
        news, self.news = self.news, False
        return news

    def candidates(self) -> Sequence[Candidate]:
        return self.pods

    def gpus(self) -> Mapping[int, GpuConfig]:
        return {0: GpuConfig(0, GpuPolicy.BURST_SHARE), 1: GpuConfig(1, GpuPolicy.FIXED_SHARE)}

    def refused(self, refusals: Mapping[str, Refusal]) -> None:
        self.told.append(refusals)

    def names(self) -> Mapping[str, tuple[str, str]]:
        return {c.spec.id: ("ml", c.spec.id.rsplit("/", 1)[-1]) for c in self.pods}

    def problems(self) -> Mapping[str, str]:
        return {}

    def close(self) -> None:
        pass


def test_another_source_is_admitted_with_its_gpu_policies_and_told_what_was_refused(
    tmp_path: Path, cgroups: Path
) -> None:
    kube = FakeKube(
        [
            Candidate(PodSpec("/kubepods/p1", 0, PodClass.ONLINE, 70), Origin.KUBERNETES, 1.0),
            Candidate(PodSpec("/kubepods/p2", 0, PodClass.OFFLINE, 70), Origin.KUBERNETES, 2.0),
        ]
    )
    # The state file's policy for GPU 1 wins over the source's.
    StateStore(tmp_path / "state").update(lambda s: s.with_gpu(GpuConfig(1, GpuPolicy.BEST_EFFORT)))
    annotate(cgroups / "x", share="10")
    desired = source(tmp_path, cgroups, Clock(), sources=[kube])
    desired.refresh()
    assert desired.state.gpu(0).policy is GpuPolicy.BURST_SHARE
    assert desired.state.gpu(1).policy is GpuPolicy.BEST_EFFORT
    assert list(desired.state.pods) == ["/kubepods/p1", "/x"]
    assert list(kube.told[-1]) == ["/kubepods/p2"]  # not /x's business
