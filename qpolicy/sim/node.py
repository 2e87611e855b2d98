"""A simulated node as a live data source: ``qpolicy daemon --enforcer sim``.

The scenario runs on the simulated GPU against the wall clock (``speed`` times faster if asked)
and starts over when it ends, with every counter carried across so Prometheus sees monotonic
series. GPU time, throttled time, online wait and the plan come from the simulation itself. The
driver side comes from the real H200 trace: each simulated process, while it runs, holds what that
PyTorch process held (its TSGs, channels, device memory) and issued its ioctls, and every kernel
the simulator submits counts as a launch.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from qpolicy.nvrm.replay import builtin_records
from qpolicy.nvrm.tracker import Tracker
from qpolicy.sim.runner import Simulation
from qpolicy.sim.scenario import Scenario
from qpolicy.telemetry.view import (
    IOCTL_LOG2_BUCKETS,
    WAIT_BUCKETS_S,
    DriverActivity,
    Enforcement,
    GpuView,
    Histogram,
    NodeView,
    PodView,
)

US = 1e6


@dataclass(frozen=True, slots=True)
class TraceActivity:
    """What the traced PyTorch process asked of the driver, and what it held at the end."""

    ioctls: dict[str, int]
    latency: Histogram
    tsgs: int
    channels: int
    device_memory: int


def trace_activity() -> TraceActivity:
    tracker = Tracker()
    buckets = [0] * IOCTL_LOG2_BUCKETS
    total_ns = 0
    for record in builtin_records():
        ioctl = tracker.feed(record)
        if ioctl is None:
            continue
        micros = record.dur_ns // 1000
        buckets[min(micros.bit_length(), IOCTL_LOG2_BUCKETS - 1)] += 1
        total_ns += record.dur_ns
    summary = tracker.summary(None)
    return TraceActivity(
        ioctls=dict(summary.escapes),
        latency=Histogram.from_log2_us(buckets, total_ns / 1e9),
        tsgs=summary.tsgs,
        channels=summary.channel_count,
        device_memory=summary.device_bytes,
    )


@dataclass
class _Carried:
    """Counters of the runs that have finished, so totals keep growing across restarts."""

    gpu_time_s: float = 0.0
    throttled_s: float = 0.0
    launches: int = 0
    ioctls: Counter[str] = field(default_factory=Counter)
    latency: Histogram | None = None
    wait: Histogram = field(default_factory=lambda: Histogram.empty(WAIT_BUCKETS_S))


class SimulatedNode:
    def __init__(
        self,
        scenario: Scenario,
        *,
        speed: float = 1.0,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not speed > 0 or not math.isfinite(speed):
            raise ValueError(f"speed must be positive, got {speed}")
        self.scenario = scenario
        self.speed = speed
        self.seed = seed
        self.clock = clock
        self.trace = trace_activity()
        self._carried = {pod.name: _Carried() for pod in scenario.pods}
        self._waits = {pod.name: Histogram.empty(WAIT_BUCKETS_S) for pod in scenario.pods}
        self._runs = 0
        self._start = clock()
        self._sim = Simulation(scenario, seed=seed, gated=True)
        self._last_busy = (0.0, 0.0)
        self._utilization: float | None = None

    @property
    def runs(self) -> int:
        return self._runs

    def advance(self) -> None:
        """Run the simulation up to the present (scaled) moment, restarting it when it ends."""
        target = (self.clock() - self._start) * self.speed
        duration = self.scenario.duration_s
        while target >= duration:
            self._sim.run_until(duration)
            self._drain_waits()
            self._carry()
            self._runs += 1
            self._start += duration / self.speed
            target -= duration
            self._sim = Simulation(self.scenario, seed=self.seed + self._runs, gated=True)
            self._last_busy = (0.0, 0.0)
        self._sim.run_until(target)
        self._drain_waits()
        now_s, busy_s = self._sim.now_s, self._sim.gpu.busy_time / US
        last_now, last_busy = self._last_busy
        if now_s - last_now > 0:
            self._utilization = min((busy_s - last_busy) / (now_s - last_now), 1.0)
            self._last_busy = (now_s, busy_s)

    def _drain_waits(self) -> None:
        for name, ctx in self._sim.contexts.items():
            if ctx.waits:
                seconds = [wait / US for wait in ctx.waits]
                ctx.waits.clear()
                self._waits[name] = self._waits[name].merged(Histogram.of(WAIT_BUCKETS_S, seconds))

    def _carry(self) -> None:
        for pod in self.scenario.pods:
            carried = self._carried[pod.name]
            ctx = self._sim.contexts[pod.name]
            carried.gpu_time_s += self._sim.gpu.gpu_time(ctx) / US
            carried.throttled_s += self._sim.gpu.blocked_time(ctx) / US
            carried.launches += self._sim.workloads[pod.name].launches
            if self._started(pod.name):
                carried.ioctls.update(self.trace.ioctls)
                carried.latency = (
                    self.trace.latency
                    if carried.latency is None
                    else carried.latency.merged(self.trace.latency)
                )

    def _started(self, name: str) -> bool:
        pod = next(p for p in self.scenario.pods if p.name == name)
        return self._sim.now_s >= pod.active[0][0]

    def _running(self, name: str) -> bool:
        pod = next(p for p in self.scenario.pods if p.name == name)
        return pod.active[0][0] <= self._sim.now_s < pod.active[-1][1]

    def view(self) -> NodeView:
        gpu = self.scenario.gpu
        plan = self._sim.control.last_plan if self._sim.control else None
        pods: list[PodView] = []
        for spec in self.scenario.pods:
            name = spec.name
            carried = self._carried[name]
            ctx = self._sim.contexts[name]
            started = self._started(name)
            running = self._running(name)
            ioctls = Counter(carried.ioctls)
            latency = carried.latency or Histogram.from_log2_us((), 0.0)
            if started:
                ioctls.update(self.trace.ioctls)
                latency = latency.merged(self.trace.latency)
            activity = DriverActivity(
                ioctls=dict(ioctls),
                ioctl_latency=latency,
                launches=carried.launches + self._sim.workloads[name].launches,
                tsgs=self.trace.tsgs if running else 0,
                channels=self.trace.channels if running else 0,
                device_memory=self.trace.device_memory if running else 0,
                processes=1 if running else 0,
            )
            planned = None
            if plan is not None:
                planned = plan.slice(name).allocation
            enforcement = Enforcement(
                gpu_time_s=carried.gpu_time_s + self._sim.gpu.gpu_time(ctx) / US,
                throttled_s=carried.throttled_s + self._sim.gpu.blocked_time(ctx) / US,
                online_wait=self._waits[name],
                planned_share=planned,
            )
            pods.append(
                PodView(
                    gpu=str(gpu.index),
                    pod=name,
                    pod_class=spec.pod_class.value,
                    share_target=None if spec.share is None else spec.share / 100,
                    memory_limit=spec.memory_limit,
                    activity=activity,
                    enforcement=enforcement,
                )
            )
        gpus = (
            GpuView(
                gpu=str(gpu.index),
                policy=gpu.policy.value,
                period_s=gpu.period_ms / 1000,
                utilization=self._utilization,
            ),
        )
        return NodeView(pods=tuple(pods), gpus=gpus, sources={"enforcer": True})
