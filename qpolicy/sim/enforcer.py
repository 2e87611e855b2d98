"""The sim enforcer: gates the simulated GPU's channels the way the rm enforcer gates real ones.

Channel controls go through a queue that carries each out ``CHANNEL_CONTROL_US`` after the previous
one, as RM controls sent from userspace were measured to take on the H200.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from qpolicy.enforcer import PodUsage
from qpolicy.enforcers.slicer import Handover, SliceScheduler
from qpolicy.engine import Plan
from qpolicy.runtime.clock import Cancellable
from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.calibration import CHANNEL_CONTROL_US
from qpolicy.sim.gpu import Context, SimGpu


class _LoopClock:
    def __init__(self, loop: EventLoop) -> None:
        self._loop = loop

    @property
    def now(self) -> float:
        return self._loop.now

    def at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return self._loop.at(when, callback)


class SimChannelControl:
    """RM controls on the simulated GPU, one after another, each ``latency_us`` long."""

    def __init__(
        self,
        gpu: SimGpu,
        contexts: Mapping[str, Context],
        original_timeslice_us: Mapping[str, float],
        latency_us: float = CHANNEL_CONTROL_US,
    ) -> None:
        self._gpu = gpu
        self._contexts = contexts
        self._original = original_timeslice_us
        self._latency = latency_us
        self._free_at = 0.0
        self.controls = 0

    @property
    def latency_us(self) -> float:
        return self._latency

    def settled_at(self) -> float:
        return max(self._free_at, self._gpu.loop.now)

    def _issue(self, action: Callable[[], None]) -> None:
        self._free_at = self.settled_at() + self._latency
        self.controls += 1
        self._gpu.loop.at(self._free_at, action)

    def set_enabled(self, pod: str, enabled: bool) -> None:
        ctx = self._contexts[pod]
        self._issue(lambda: self._gpu.set_enabled(ctx, enabled))

    def set_timeslice(self, pod: str, timeslice_us: int | None) -> None:
        ctx = self._contexts[pod]
        value = self._original[pod] if timeslice_us is None else float(timeslice_us)
        self._issue(lambda: self._gpu.set_timeslice(ctx, value))


class SimUsageSensor:
    exact = True
    """Reads the simulated GPU's ground truth, as nvmock's debugfs gives it in the VM tier."""

    def __init__(self, gpu: SimGpu, contexts: Mapping[str, Context]) -> None:
        self._gpu = gpu
        self._contexts = contexts

    def gpu_time_us(self, pod: str) -> float:
        return self._gpu.gpu_time(self._contexts[pod])

    def idle_for_us(self, pod: str) -> float:
        return self._gpu.idle_for(self._contexts[pod])


class SimEnforcer:
    name = "sim"

    def __init__(
        self,
        gpu: SimGpu,
        contexts: Mapping[str, Context],
        *,
        handover: Handover = "make-before-break",
    ) -> None:
        original = {pod: ctx.timeslice_us for pod, ctx in contexts.items()}
        self.control = SimChannelControl(gpu, contexts, original)
        self.scheduler = SliceScheduler(
            _LoopClock(gpu.loop),
            self.control,
            SimUsageSensor(gpu, contexts),
            handover=handover,
        )

    def collect(self) -> Mapping[str, PodUsage]:
        return self.scheduler.collect()

    def apply(self, plan: Plan) -> None:
        self.scheduler.apply(plan)

    def stand_down(self) -> None:
        self.scheduler.release()

    def release(self) -> None:
        self.scheduler.release()
