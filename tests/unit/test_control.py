"""The control loop's period: stretched for enforcers whose hand-overs are expensive."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from qpolicy.control import ControlLoop
from qpolicy.enforcers.base import PodUsage
from qpolicy.engine import Plan
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec


class RecordingEnforcer:
    name = "recording"

    def __init__(self) -> None:
        self.usage: dict[str, PodUsage] = {}
        self.plans: list[Plan] = []

    def collect(self) -> Mapping[str, PodUsage]:
        return self.usage

    def apply(self, plan: Plan) -> None:
        self.plans.append(plan)

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
        # A lone pod that may use everything is never switched.
        (GpuPolicy.BEST_EFFORT, [offline("a", None)], 50),
        (GpuPolicy.BEST_EFFORT, [offline(f"p{i}", None) for i in range(10)], 2000),
        # Online pods run side by side: no turns, no stretch.
        (
            GpuPolicy.BURST_SHARE,
            [PodSpec("on", 0, PodClass.ONLINE, 30), offline("a", 70)],
            50,
        ),
    ],
)
def test_the_period_is_stretched_to_the_minimum_turn(
    policy: GpuPolicy, pods: list[PodSpec], period_ms: int
) -> None:
    enforcer = RecordingEnforcer()
    enforcer.usage = {p.id: PodUsage(0, hungry=True) for p in pods}
    loop = ControlLoop(GpuConfig(0, policy), pods, enforcer, min_turn_us=200_000)
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
