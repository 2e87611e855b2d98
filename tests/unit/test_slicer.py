"""The slice scheduler driving the simulated GPU: hand-overs, caps, idle detection, release."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from qpolicy.control import ControlLoop
from qpolicy.enforcers.slicer import Handover
from qpolicy.engine import OFFLINE_TIMESLICE_US
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.calibration import CHANNEL_CONTROL_US, CUDA_TIMESLICE_US
from qpolicy.sim.enforcer import SimEnforcer
from qpolicy.sim.gpu import Context, SimGpu
from qpolicy.sim.workload import Saturate

L = CHANNEL_CONTROL_US


@dataclass
class Rig:
    loop: EventLoop
    gpu: SimGpu
    contexts: dict[str, Context]
    enforcer: SimEnforcer
    control: ControlLoop
    issued: list[tuple[float, str, str]] = field(default_factory=list)

    def run(self, seconds: float) -> None:
        self.loop.run_until(seconds * 1e6)

    def used(self, pod: str) -> float:
        return self.gpu.gpu_time(self.contexts[pod])


def rig(
    policy: GpuPolicy,
    pods: list[PodSpec],
    period_ms: int = 50,
    handover: Handover = "make-before-break",
) -> Rig:
    loop = EventLoop()
    gpu = SimGpu(loop)
    contexts = {p.id: gpu.add_context(p.id, CUDA_TIMESLICE_US) for p in pods}
    enforcer = SimEnforcer(gpu, contexts, handover=handover)
    control = ControlLoop(GpuConfig(0, policy, period_ms), pods, enforcer)
    result = Rig(loop, gpu, contexts, enforcer, control)
    channel = enforcer.control
    original_enabled, original_slice = channel.set_enabled, channel.set_timeslice

    def set_enabled(pod: str, enabled: bool) -> None:
        result.issued.append((loop.now, pod, "on" if enabled else "off"))
        original_enabled(pod, enabled)

    def set_timeslice(pod: str, timeslice: int | None) -> None:
        result.issued.append((loop.now, pod, f"ts={timeslice}"))
        original_slice(pod, timeslice)

    channel.set_enabled = set_enabled  # type: ignore[method-assign]
    channel.set_timeslice = set_timeslice  # type: ignore[method-assign]
    period = period_ms * 1000.0

    def step(index: int) -> None:
        control.step()
        loop.at((index + 1) * period, lambda: step(index + 1))

    loop.at(0.0, lambda: step(0))
    return result


def saturate(r: Rig, pod: str, kernel_ms: float = 2.0, start_s: float = 0.0) -> Saturate:
    return Saturate(
        r.loop,
        r.gpu,
        r.contexts[pod],
        kernel_us=kernel_ms * 1000,
        sync_every=8,
        active=[(start_s * 1e6, 1e12)],
    )


def test_hand_over_opens_the_next_pod_before_closing_the_current_one() -> None:
    pods = [PodSpec("a", 0, share=50), PodSpec("b", 0, share=50)]
    r = rig(GpuPolicy.BURST_SHARE, pods)
    saturate(r, "a")
    saturate(r, "b")
    r.run(1.0)
    controls = [e for e in r.issued if e[0] > 0]
    closes = [i for i, (_, _, what) in enumerate(controls) if what == "off"]
    # Under burst-share both pods always have work, so every close is a hand-over: the other pod
    # was opened in the same instant, just before.
    assert len(closes) >= 15
    for i in closes:
        opened_at, opened, what = controls[i - 1]
        assert what == "on" and opened != controls[i][1] and opened_at == controls[i][0]


def test_one_offline_pod_alone_is_never_switched() -> None:
    pods = [PodSpec("a", 0, share=60)]
    r = rig(GpuPolicy.BURST_SHARE, pods)
    saturate(r, "a")
    r.run(2.0)
    assert [e for e in r.issued if e[2] in ("on", "off")] == []
    assert r.used("a") / 2e6 > 0.99


def test_fixed_share_closes_a_lone_pod_at_its_share() -> None:
    r = rig(GpuPolicy.FIXED_SHARE, [PodSpec("a", 0, share=30)])
    saturate(r, "a")
    r.run(5.0)
    assert r.used("a") / 5e6 == pytest.approx(0.30, abs=0.003)
    usage = r.enforcer.collect()
    assert usage["a"].hungry


def test_capped_online_pod_is_throttled_and_reported_hungry() -> None:
    pods = [PodSpec("web", 0, PodClass.ONLINE, share=10), PodSpec("batch", 0, share=80)]
    r = rig(GpuPolicy.FIXED_SHARE, pods)
    saturate(r, "web", kernel_ms=0.5)
    saturate(r, "batch")
    r.run(2.99)
    assert r.used("web") / 2.99e6 == pytest.approx(0.10, abs=0.01)
    assert r.enforcer.scheduler.stats.throttles >= 50
    assert r.enforcer.collect()["web"].hungry


def test_an_idle_pod_gives_its_turn_away_and_is_not_hungry() -> None:
    pods = [PodSpec("a", 0, share=50), PodSpec("b", 0, share=50)]
    r = rig(GpuPolicy.BURST_SHARE, pods)
    saturate(r, "a")
    b = saturate(r, "b", start_s=100)  # never starts
    r.run(2.0)
    assert b.kernels_done == 0
    assert r.used("a") / 2e6 > 0.97
    usage = r.enforcer.collect()
    assert usage["a"].hungry and not usage["b"].hungry and usage["b"].used_us == 0


def test_turn_ends_are_counted_by_how_each_turn_ended() -> None:
    """Two busy pods under fixed-share end their turns on their budgets or deadlines; beside a
    pod that never starts, its turn is skipped and the busy one's run to each period's end."""
    busy = rig(GpuPolicy.FIXED_SHARE, [PodSpec("a", 0, share=50), PodSpec("b", 0, share=50)])
    saturate(busy, "a")
    saturate(busy, "b")
    busy.run(1.0)
    ends = busy.enforcer.scheduler.stats.ends
    periods = busy.enforcer.scheduler.stats.periods
    assert set(ends) <= {"budget", "deadline"}
    # Two turns a period, counted as the next period starts.
    assert sum(ends.values()) == 2 * (periods - 1)

    lone = rig(GpuPolicy.BURST_SHARE, [PodSpec("a", 0, share=50), PodSpec("b", 0, share=50)])
    saturate(lone, "a")
    saturate(lone, "b", start_s=100)  # never starts
    lone.run(1.0)
    ends = lone.enforcer.scheduler.stats.ends
    periods = lone.enforcer.scheduler.stats.periods
    # b's first turn is skipped; then b is planned nothing, and a runs each period to its end.
    assert ends.get("skipped", 0) + ends.get("idle", 0) >= 1
    assert ends.get("deadline", 0) + ends.get("burst deadline", 0) >= periods - 2
    assert "budget" not in ends


def test_release_reopens_every_pod_and_restores_timeslices() -> None:
    pods = [
        PodSpec("web", 0, PodClass.ONLINE, share=20),
        PodSpec("a", 0, share=40),
        PodSpec("b", 0, share=40),
    ]
    r = rig(GpuPolicy.FIXED_SHARE, pods)
    saturate(r, "a")
    saturate(r, "b")
    r.run(1.0)
    timeslices = {ctx.name: ctx.timeslice_us for ctx in r.gpu.contexts}
    assert timeslices == {"web": 8192, "a": OFFLINE_TIMESLICE_US, "b": OFFLINE_TIMESLICE_US}
    r.enforcer.release()
    r.loop.run_until(r.loop.now + 10 * L)
    assert all(ctx.enabled for ctx in r.gpu.contexts)
    assert all(ctx.timeslice_us == CUDA_TIMESLICE_US for ctx in r.gpu.contexts)


def test_break_before_make_never_opens_two_offline_pods_and_keeps_shares() -> None:
    pods = [PodSpec("a", 0, share=50), PodSpec("b", 0, share=30), PodSpec("c", 0, share=20)]
    r = rig(GpuPolicy.FIXED_SHARE, pods, handover="break-before-make")
    for name, kernel_ms in (("a", 2.0), ("b", 1.0), ("c", 0.5)):
        saturate(r, name, kernel_ms=kernel_ms)
    overlaps = []
    original = r.gpu.set_enabled

    def watch(ctx: Context, enabled: bool) -> None:
        original(ctx, enabled)
        open_now = [c.name for c in r.gpu.contexts if c.enabled]
        if len(open_now) > 1:
            overlaps.append((r.loop.now, open_now))

    r.gpu.set_enabled = watch  # type: ignore[method-assign]
    r.run(10.0)
    # Before the first plan every context is open, as processes start; after it, never two.
    assert [o for o in overlaps if o[0] > 0.1e6] == []
    for name, share in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        assert r.used(name) / 10e6 == pytest.approx(share, abs=0.02), name


@pytest.mark.parametrize("how", ["removed", "moved to another GPU"])
def test_a_pod_that_leaves_the_plan_while_closed_is_reopened_within_a_period(how: str) -> None:
    pods = [
        PodSpec("infer", 0, PodClass.ONLINE, 20),
        PodSpec("a", 0, PodClass.OFFLINE, 40),
        PodSpec("b", 0, PodClass.OFFLINE, 40),
    ]
    r = rig(GpuPolicy.BURST_SHARE, pods)
    for name in ("a", "b"):
        saturate(r, name)
    r.run(0.3)
    closed = next(name for name in ("a", "b") if not r.contexts[name].enabled)
    assert r.contexts[closed].timeslice_us == OFFLINE_TIMESLICE_US
    gone_at = r.loop.now
    remaining = [p for p in pods if p.id != closed]
    if how == "moved to another GPU":
        remaining.append(PodSpec(closed, 1, PodClass.OFFLINE, 40))
    r.control.pods = [p for p in remaining if p.gpu == 0]
    r.run(gone_at / 1e6 + 0.05 + 2 * L / 1e6)
    assert r.contexts[closed].enabled
    assert r.contexts[closed].timeslice_us == CUDA_TIMESLICE_US
    reopened = [t for t, pod, what in r.issued if pod == closed and what == "on" and t >= gone_at]
    assert reopened and reopened[0] - gone_at <= 50_000
