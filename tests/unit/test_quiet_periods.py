"""Quiet periods: where nothing can be gated (one offline pod at most, work conserving, no
online cap the sensor can hold), the rm enforcer's loop steps once a second and looks at no pod
in between, and what must still follow processes (a TSG's timeslice, a tenant's own set)
follows the daemon's tick instead of the period's start; a change of the desired state cuts the
stretched period short."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

from qpolicy.backends.rm import DEFAULT_MIN_TURN_MS
from qpolicy.control import QUIET_PERIOD_US
from qpolicy.enforcers.rm.sensor import RmUsageSensor
from qpolicy.engine import OFFLINE_TIMESLICE_US as OFFLINE_US
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from tests.unit.test_rm_enforcer import LATENCY, rig

ONLINE_AND_TRAINER = [PodSpec("/web", 0, PodClass.ONLINE, share=20), PodSpec("/train", 0, share=80)]
MIN_TURN_US = DEFAULT_MIN_TURN_MS * 1000


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The virtual times of the sensor's reads."""
    seen: list[float] = []
    poll = RmUsageSensor.poll

    def counted(sensor: RmUsageSensor, pods: AbstractSet[str] | None = None) -> None:
        seen.append(sensor.control.loop.now)
        poll(sensor, pods)

    monkeypatch.setattr(RmUsageSensor, "poll", counted)
    yield seen


def test_an_online_pod_and_one_trainer_are_stepped_once_a_second_and_never_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, polls: list[float]
) -> None:
    """The bench's online row (burst-share 20 / 80): nothing is ever closed, so the loop's 20
    steps and looks a second bought nothing (the whole daemon read 0.89-2.44 % of a core in
    those rows on H100 hosts, 0.50-0.67 % with quiet periods: BENCHMARKS.md, 2026-12-07)."""
    r = rig(
        tmp_path, monkeypatch, ONLINE_AND_TRAINER, GpuPolicy.BURST_SHARE, MIN_TURN_US, quiet=True
    )
    r.loop.run_until(3e6)
    assert r.control.last_plan is not None
    assert r.control.last_plan.period_us == QUIET_PERIOD_US
    assert r.control.stretched_for == "quiet"
    calls, read_from, gpu_from = (
        len(r.driver.calls),
        len(polls),
        r.enforcer.sensor.gpu_time_us("/train"),
    )
    r.loop.run_until(13e6)
    # One read a step: the period's end (a daemon's tick reads nothing of the sensor).
    assert len(polls) - read_from == pytest.approx(10, abs=1)
    # Nothing opened or closed, and the trainer ran all the while.
    assert len(r.driver.calls) == calls
    assert (r.enforcer.sensor.gpu_time_us("/train") - gpu_from) / 10e6 == pytest.approx(
        1.0, abs=0.01
    )
    assert r.driver.timeslice[0x20] == OFFLINE_US


def test_the_same_rig_without_quiet_periods_looks_twenty_times_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, polls: list[float]
) -> None:
    """What quiet periods save, on the same rig: the loop as it was (steps every 50 ms)."""
    r = rig(tmp_path, monkeypatch, ONLINE_AND_TRAINER, GpuPolicy.BURST_SHARE, MIN_TURN_US)
    r.loop.run_until(3e6)
    read_from = len(polls)
    r.loop.run_until(13e6)
    assert (len(polls) - read_from) / 10 == pytest.approx(20, abs=1)


def test_two_offline_pods_still_take_turns_and_are_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, polls: list[float]
) -> None:
    pods = [*ONLINE_AND_TRAINER[:1], PodSpec("/a", 0, share=40), PodSpec("/b", 0, share=40)]
    r = rig(tmp_path, monkeypatch, pods, GpuPolicy.BURST_SHARE, MIN_TURN_US, quiet=True)
    r.loop.run_until(3e6)
    assert r.control.last_plan is not None
    assert r.control.last_plan.period_us == 2 * MIN_TURN_US  # two turns of the minimum
    assert r.control.stretched_for == "turns"
    calls, read_from = len(r.driver.calls), len(polls)
    r.loop.run_until(7e6)
    assert len(r.driver.calls) > calls  # hand-overs
    assert len(polls) - read_from > 4 * 10  # the holder is looked at between steps


def test_a_tenant_timeslice_is_set_again_within_a_tick_in_a_quiet_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libcuda's own SET_TIMESLICE (2048 us, ~110 ms after it makes a TSG) undoes the offline
    timeslice: under 50 ms periods the next period's start set it again; in a quiet second the
    daemon's tick does, not the period's end."""
    r = rig(
        tmp_path, monkeypatch, ONLINE_AND_TRAINER, GpuPolicy.BURST_SHARE, MIN_TURN_US, quiet=True
    )
    r.loop.run_until(3.05e6)
    assert r.control.last_plan is not None and r.control.last_plan.period_us == QUIET_PERIOD_US
    (train,) = r.resolver._groups["/train"]
    r.driver.timeslice[0x20] = 2048
    r.resolver._groups["/train"] = [dataclasses.replace(train, timeslice_sets=(1,))]
    periods = r.enforcer.scheduler.stats.periods
    r.loop.run_until(r.loop.now + 100_000 + 3 * LATENCY)
    assert r.driver.timeslice[0x20] == OFFLINE_US
    assert r.enforcer.scheduler.stats.periods == periods  # no period began meanwhile


def test_a_trainer_that_starts_in_a_quiet_period_gets_the_offline_timeslice_within_a_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = rig(
        tmp_path, monkeypatch, ONLINE_AND_TRAINER, GpuPolicy.BURST_SHARE, MIN_TURN_US, quiet=True
    )
    late = r.resolver._groups.pop("/train")
    r.loop.run_until(3.05e6)
    assert r.control.last_plan is not None and r.control.last_plan.period_us == QUIET_PERIOD_US
    assert 0x20 not in r.driver.timeslice or r.driver.timeslice[0x20] != OFFLINE_US
    r.resolver._groups["/train"] = late  # its process starts
    r.loop.run_until(r.loop.now + 100_000 + 3 * LATENCY)
    assert r.driver.timeslice[0x20] == OFFLINE_US


def test_the_backend_follows_the_tracker_and_cuts_a_stretched_period_for_new_pods(
    tmp_path: Path,
) -> None:
    """RmBackend: a tick at which the probe's tracker moved has each GPU in a quiet period
    follow the processes (once, not at every tick; others follow at their periods' starts, as
    before); a desired state with other pods on a GPU steps it
    within a configured period, whatever its stretched period says; the quiet check is the
    scheduler's."""
    from qpolicy.backends.base import BackendContext
    from qpolicy.backends.rm import RmBackend
    from qpolicy.runtime.realtime import RealtimeLoop
    from qpolicy.state import DesiredState
    from qpolicy.telemetry.cgroups import CgroupMap
    from qpolicy.telemetry.probesource import ProbeSource
    from tests.unit.test_telemetry_live import FakeProbe

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    source = ProbeSource(FakeProbe(), CgroupMap(root=tmp_path))
    context = BackendContext(RealtimeLoop(), source, state_dir, lambda: tmp_path, lambda: 0.0)
    backend = RmBackend(context, gpus=list)
    try:
        gpu = GpuConfig(0, GpuPolicy.BURST_SHARE)
        pods = {p.id: p for p in ONLINE_AND_TRAINER}
        backend.sync(DesiredState(gpus={0: gpu}, pods=pods))
        driven = backend._gpus[0]
        assert driven.periodic.control.quiet == driven.enforcer.scheduler.nothing_to_gate
        followed: list[int] = []
        woken: list[int] = []
        driven.enforcer.follow_processes = lambda: followed.append(1)  # type: ignore[method-assign]
        driven.periodic.wake = lambda: woken.append(1)  # type: ignore[method-assign]
        # Not in a quiet period (its first, configured one): the period's start follows.
        source.view.tracker.changed("alloc")
        backend.refresh()
        assert followed == []
        driven.periodic.control.stretched_for = "quiet"
        backend.refresh()
        assert followed == []  # nothing moved since the last tick
        source.view.tracker.changed("alloc")
        backend.refresh()
        backend.refresh()
        assert len(followed) == 1
        # The same pods again: nothing to cut short; another pod: planned within a period.
        backend.sync(DesiredState(gpus={0: gpu}, pods=dict(pods)))
        assert woken == []
        more = {**pods, "/b": PodSpec("/b", 0)}
        backend.sync(DesiredState(gpus={0: gpu}, pods=more))
        assert woken == [1]
    finally:
        backend.close()
