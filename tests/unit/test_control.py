"""The control loop's period: stretched for enforcers whose hand-overs are expensive."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

import pytest

from qpolicy.control import ControlLoop, PeriodicControl
from qpolicy.enforcer import PodUsage
from qpolicy.enforcers.slicer import nothing_to_gate
from qpolicy.engine import Plan, plan
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.runtime.virtual import EventLoop


class RecordingEnforcer:
    name = "recording"

    def __init__(self) -> None:
        self.usage: dict[str, PodUsage] = {}
        self.plans: list[Plan] = []
        self.stood_down = 0

    def collect(self) -> Mapping[str, PodUsage]:
        return self.usage

    def apply(self, plan: Plan) -> None:
        self.plans.append(plan)

    def stand_down(self) -> None:
        self.stood_down += 1

    def release(self) -> None:
        pass


def offline(name: str, share: int | None) -> PodSpec:
    return PodSpec(name, 0, PodClass.OFFLINE, share)


@pytest.mark.parametrize(
    ("policy", "pods", "period_ms"),
    [
        # Two pods taking turns: each turn about 200 ms.
        (GpuPolicy.FIXED_SHARE, [offline("a", 70), offline("b", 30)], 400),
        # A lone capped pod is still opened and closed once a period.
        (GpuPolicy.FIXED_SHARE, [offline("a", 30)], 400),
        # A lone pod that may use everything is never switched: nothing to gate, the loop
        # steps once a second.
        (GpuPolicy.BEST_EFFORT, [offline("a", None)], 1000),
        (GpuPolicy.BEST_EFFORT, [offline(f"p{i}", None) for i in range(10)], 2000),
        # Online pods run side by side with one offline pod: no turns, nothing to gate.
        (
            GpuPolicy.BURST_SHARE,
            [PodSpec("on", 0, PodClass.ONLINE, 30), offline("a", 70)],
            1000,
        ),
        # ... but two offline pods take turns, whatever the online pod does.
        (
            GpuPolicy.BURST_SHARE,
            [PodSpec("on", 0, PodClass.ONLINE, 30), offline("a", 40), offline("b", 30)],
            400,
        ),
        # An online pod capped at its share (fixed-share) is closed when its cap is used.
        (GpuPolicy.FIXED_SHARE, [PodSpec("on", 0, PodClass.ONLINE, 30)], 50),
    ],
)
def test_the_period_is_stretched_to_the_minimum_turn(
    policy: GpuPolicy, pods: list[PodSpec], period_ms: int
) -> None:
    enforcer = RecordingEnforcer()
    enforcer.usage = {p.id: PodUsage(0, hungry=True) for p in pods}
    # The rm enforcer's answer (its sensor measures no GPU time: online caps do not hold).
    quiet = functools.partial(nothing_to_gate, caps_hold=False)
    loop = ControlLoop(GpuConfig(0, policy), pods, enforcer, min_turn_us=200_000, quiet=quiet)
    # The first plan is a change: it runs one configured period, to measure demand again.
    assert loop.step().period_us == 50_000
    assert loop.step().period_us == period_ms * 1000


def test_a_plan_that_changes_is_not_stretched() -> None:
    enforcer = RecordingEnforcer()
    pods = [offline("a", 70), offline("b", 30)]
    loop = ControlLoop(GpuConfig(0, GpuPolicy.FIXED_SHARE), pods, enforcer, min_turn_us=200_000)
    enforcer.usage = {p.id: PodUsage(0, hungry=True) for p in pods}
    loop.step()
    assert loop.step().period_us == 400_000
    # /b went idle: a new plan, one configured period long...
    enforcer.usage = {"a": PodUsage(280_000, hungry=True), "b": PodUsage(5_000, hungry=False)}
    changed = loop.step()
    assert changed.slice("b").allocation == pytest.approx(5_000 / 400_000)
    assert changed.period_us == 50_000
    # ...and when /b is hungry again, another change.
    enforcer.usage = {"a": PodUsage(35_000, hungry=True), "b": PodUsage(600, hungry=True)}
    assert loop.step().period_us == 50_000
    assert loop.step().period_us == 400_000
    # Of the six periods, the second and the last were stretched.
    assert loop.stretched == 2


def test_without_a_minimum_turn_the_period_is_the_configured_one() -> None:
    pods = [offline(f"p{i}", None) for i in range(10)]
    loop = ControlLoop(GpuConfig(0, GpuPolicy.BEST_EFFORT, 20), pods, RecordingEnforcer())
    assert loop.step().period_us == 20_000


def test_demand_is_measured_over_the_time_the_period_really_ran() -> None:
    enforcer = RecordingEnforcer()
    pods = [offline("a", None), offline("b", None)]
    loop = ControlLoop(GpuConfig(0, GpuPolicy.BEST_EFFORT), pods, enforcer)
    loop.step()
    # Cut short after 10 ms of a 50 ms period, /a used 9 ms and is done: it wanted 90 %.
    enforcer.usage = {"a": PodUsage(9_000, hungry=False), "b": PodUsage(1_000, hungry=True)}
    plan = loop.step(elapsed_us=10_000)
    assert plan.slice("a").allocation == pytest.approx(0.5)
    loop.step()
    enforcer.usage = {"a": PodUsage(9_000, hungry=False), "b": PodUsage(1_000, hungry=False)}
    plan = loop.step(elapsed_us=10_000)
    assert plan.slice("a").allocation == pytest.approx(0.9)
    assert plan.slice("b").allocation == pytest.approx(0.1)


def test_a_plan_that_fails_stands_the_enforcer_down_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Oversubscribed: every plan raises. Pods closed by an earlier plan must not stay closed.
    pods = [offline("a", 70), offline("b", 60)]
    enforcer = RecordingEnforcer()
    loop = EventLoop()
    periodic = PeriodicControl(
        loop, ControlLoop(GpuConfig(0, GpuPolicy.FIXED_SHARE), pods, enforcer)
    )
    with caplog.at_level(logging.WARNING, "qpolicy.control"):
        periodic.step()
        loop.run_until(20 * 50_000)
    assert enforcer.plans == []
    assert enforcer.stood_down == periodic.steps_failed > 10
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "sum to 130 > 100" in warnings[0]
    assert "every pod left open" in warnings[0]
    # Fixed: the next step plans again, and the recovery is logged.
    periodic.control.pods = [offline("a", 70)]
    loop.run_until(loop.now + 50_000)
    assert len(enforcer.plans) == 1 and periodic.failing is None


def test_a_bug_in_an_enforcer_is_contained_like_a_plan_that_fails() -> None:
    class Broken(RecordingEnforcer):
        def collect(self) -> Mapping[str, PodUsage]:
            raise RuntimeError("boom")

    enforcer = Broken()
    loop = EventLoop()
    periodic = PeriodicControl(
        loop, ControlLoop(GpuConfig(0, GpuPolicy.BEST_EFFORT), [offline("a", None)], enforcer)
    )
    periodic.step()
    loop.run_until(3 * 50_000)
    assert enforcer.stood_down == 4 and periodic.failing == "RuntimeError('boom')"


def test_nothing_to_gate_where_no_pod_can_be_closed_before_the_period_ends() -> None:
    online = PodSpec("on", 0, PodClass.ONLINE, 30)
    busy = {"on": 1.0, "a": 1.0, "b": 1.0}

    def planned(policy: GpuPolicy, *pods: PodSpec) -> Plan:
        return plan(GpuConfig(0, policy), list(pods), {p.id: busy[p.id] for p in pods})

    one = planned(GpuPolicy.BURST_SHARE, online, offline("a", 70))
    # Burst-share caps the online pod at its share while the trainer is busy: a cap the rm
    # enforcer's launch counters cannot hold (no GPU time measured), the simulator's can.
    assert any(s.cap is not None for s in one.slices)
    assert nothing_to_gate(one, caps_hold=False)
    assert not nothing_to_gate(one, caps_hold=True)
    # Two offline pods take turns; fixed-share closes a pod whose share is used.
    assert not nothing_to_gate(
        planned(GpuPolicy.BURST_SHARE, online, offline("a", 40), offline("b", 30)),
        caps_hold=False,
    )
    assert not nothing_to_gate(planned(GpuPolicy.FIXED_SHARE, offline("a", 70)), caps_hold=False)
    assert nothing_to_gate(planned(GpuPolicy.BEST_EFFORT, offline("a", None)), caps_hold=True)
    assert nothing_to_gate(planned(GpuPolicy.BEST_EFFORT, online), caps_hold=False)
