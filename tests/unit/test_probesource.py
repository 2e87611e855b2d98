"""The probe as the daemon's source: what a published view reads, and what it keeps."""

from __future__ import annotations

import threading
from pathlib import Path

from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.probe import CgroupCounters
from qpolicy.telemetry.probesource import ProbeSource
from qpolicy.telemetry.wire import ProbeRecord
from tests.unit.test_telemetry_live import FakeProbe, rm_alloc


class ReadCounting(FakeProbe):
    """The four counter maps (``counters``, by the thread that read them) and the launch map
    (``launches``) read apart, as the probe reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.launch_reads = 0
        self.counter_reads: list[int] = []

    def counters(self) -> dict[int, CgroupCounters]:
        self.counter_reads.append(threading.get_ident())
        return super().counters()

    def launches(self) -> dict[int, int]:
        self.launch_reads += 1
        return {cgid: c.launches for cgid, c in self.counts.items()}


def source(tmp_path: Path) -> tuple[ProbeSource, ReadCounting, int]:
    root = tmp_path / "cgroup"
    (root / "pod").mkdir(parents=True)
    cgroups = CgroupMap(root=root)
    cgid = cgroups.id_of("/pod")
    probe = ReadCounting()
    probe.counts = {cgid: CgroupCounters(cgid, ioctls=1, escapes={"RM_ALLOC": 1}, launches=5)}
    return ProbeSource(probe, cgroups), probe, cgid


def test_a_view_takes_the_launches_of_a_recent_look_and_reads_them_when_none_is_recent(
    tmp_path: Path,
) -> None:
    src, probe, cgid = source(tmp_path)
    assert src.launches() == {cgid: 5} and probe.launch_reads == 1
    probe.counts[cgid] = CgroupCounters(cgid, launches=9)
    # The enforcer's look a moment ago stands for the view.
    assert src.activity(counters=False)[cgid].activity.launches == 5
    assert probe.launch_reads == 1
    assert src.recent_launches(max_age_s=0.0) == {cgid: 9} and probe.launch_reads == 2


class WithWaits(ReadCounting):
    """As NvProbe: its activity read counts waits for the GPU with the launches, and keeps each
    cgroup's calls apart in ``cuda_calls``."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: dict[int, tuple[int, int]] = {}
        self.cuda_calls: dict[int, tuple[int, int, int]] = {}

    def launches(self) -> dict[int, int]:
        self.launch_reads += 1
        self.cuda_calls = {
            cgid: (c.launches, *self.waits.get(cgid, (0, 0))) for cgid, c in self.counts.items()
        }
        return {cgid: sum(calls) for cgid, calls in self.cuda_calls.items()}


def test_a_view_between_scrapes_shows_launches_apart_from_the_waits_the_sensor_counts_with_them(
    tmp_path: Path,
) -> None:
    """The rm enforcer's read is launches, synchronize calls and "not ready" polls together; a
    published view, and the status file, show each as what it is, and a scrape the same."""
    root = tmp_path / "cgroup"
    (root / "pod").mkdir(parents=True)
    cgroups = CgroupMap(root=root)
    cgid = cgroups.id_of("/pod")
    probe = WithWaits()
    probe.counts = {cgid: CgroupCounters(cgid, launches=5, waits=2, polls=30)}
    probe.waits = {cgid: (2, 30)}
    src = ProbeSource(probe, cgroups)
    assert src.launches() == {cgid: 37}  # what the sensor watches move
    between = src.activity(counters=False)[cgid].activity
    scraped = src.activity(counters=True)[cgid].activity
    for activity in (between, scraped):
        assert (activity.launches, activity.waits, activity.polls) == (5, 2, 30)


def test_what_processes_hold_is_recomputed_when_the_tracker_changes(tmp_path: Path) -> None:
    src, probe, cgid = source(tmp_path)
    probe.pending = [
        ProbeRecord("open", ts=0, tid=10, ret=5, s="/dev/nvidiactl", pid=10, cgroup=cgid),
        rm_alloc(10, cgid, 0xC1D00001, 0, 0x41),
        rm_alloc(10, cgid, 0x2, 0xC1D00001, 0x80),
    ]
    src.refresh()
    tracker = src.view.tracker
    summaries = []
    summary = tracker.summary

    def counted(pid: int | None) -> object:
        summaries.append(pid)
        return summary(pid)

    tracker.summary = counted  # type: ignore[method-assign,assignment]
    before = src.activity(counters=False)[cgid].activity
    assert (before.tsgs, before.processes) == (0, 1) and summaries == [10]
    src.activity(counters=False)
    src.activity()
    assert summaries == [10]  # the tracker did not change: nothing walked again
    probe.pending = [rm_alloc(10, cgid, 0x3, 0x2, 0xA06C)]
    src.refresh()
    after = src.activity(counters=False)[cgid].activity
    assert after.tsgs == 1 and summaries == [10, 10]
    assert src.activity()[cgid].activity.tsgs == 1  # and with the counters read too
    assert src.activity()[cgid].activity.ioctls == {"RM_ALLOC": 1}


def test_single_counters_come_from_the_probe_where_it_reads_them_one_by_one(
    tmp_path: Path,
) -> None:
    src, probe, cgid = source(tmp_path)
    # A probe without single reads: the whole map, filtered.
    assert src.launches_of([cgid, 42]) == {cgid: 5} and probe.launch_reads == 1

    class Single(ReadCounting):
        def launches_of(self, cgroups: list[int]) -> dict[int, int]:
            return {c: 7 for c in cgroups if c == cgid}

    single = Single()
    single.counts = dict(probe.counts)
    src = ProbeSource(single, src.view.cgroups)
    assert src.launches_of([cgid, 42]) == {cgid: 7} and single.launch_reads == 0
