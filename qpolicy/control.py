"""The control loop of one GPU: sense, plan, act, once per period.

It does not know which enforcer it drives; the daemon runs one per GPU on real time, the simulator
runs one on simulated time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from qpolicy.demand import estimate_demand
from qpolicy.enforcer import Enforcer
from qpolicy.engine import Plan, plan
from qpolicy.errors import QPolicyError
from qpolicy.model import GpuConfig, PodClass, PodSpec
from qpolicy.runtime.clock import Cancellable, Loop

log = logging.getLogger(__name__)

#: How far allocations may move between two plans that still count as the same.
STEADY_TOLERANCE = 0.02
#: The period of a steady plan with nothing to gate (one offline pod at most, work conserving,
#: no online cap) where switches are expensive: the loop's steps then only keep the demand
#: and the metrics current. With the scheduler's looks, 20 a second cost the rm enforcer's
#: daemon 0.8-0.9 % of a core (make bench daemon's online + trainer row, BENCHMARKS.md
#: 2026-12-07, fifty-sixth session). A second offline pod, a pod that wakes with nothing
#: planned, or a change of the desired state steps sooner (PeriodicControl.wake).
QUIET_PERIOD_US = 1_000_000


class ControlLoop:
    """One GPU's loop.

    ``min_turn_us`` bounds how often an enforcer whose switches are expensive hands the GPU over:
    when offline pods take turns and the plan repeats the last one, the period is stretched so
    that each turn is about that long (as CFS stretches its latency period with the number of
    runnable tasks). A repeating plan in which ``quiet`` (the enforcer's) finds nothing to gate
    between steps is stretched to ``QUIET_PERIOD_US``. The plan then carries the stretched
    period, and the caller steps again when it ends.
    """

    def __init__(
        self,
        gpu: GpuConfig,
        pods: Sequence[PodSpec],
        enforcer: Enforcer,
        *,
        min_turn_us: float | None = None,
        quiet: Callable[[Plan], bool] | None = None,
    ) -> None:
        self.gpu = gpu
        self.pods = [p for p in pods if p.gpu == gpu.index]
        self.enforcer = enforcer
        self.min_turn_us = min_turn_us
        self.quiet = quiet
        self.last_plan: Plan | None = None
        #: Periods stretched for ``min_turn_us`` or as quiet; the rest ran as configured (a plan
        #: that changed, or nothing to stretch).
        self.stretched = 0
        #: Why the last plan's period is longer than configured: "turns" (each offline pod's
        #: turn the minimum), "quiet" (nothing to gate), or None (as configured).
        self.stretched_for: str | None = None

    def step(self, elapsed_us: float | None = None) -> Plan:
        """Close the period that ends now and start the next one.

        ``elapsed_us`` is how long the closing period really ran, when it was cut short.
        """
        usage = self.enforcer.collect()
        if self.last_plan is None:
            # Nothing measured yet: assume everyone is busy; idle pods show up within a period.
            demand = {p.id: 1.0 for p in self.pods}
        else:
            ran = elapsed_us if elapsed_us is not None else self.last_plan.period_us
            demand = estimate_demand(usage, max(ran, 1.0))
        self.last_plan = self._stretched(plan(self.gpu, self.pods, demand))
        self.enforcer.apply(self.last_plan)
        return self.last_plan

    def _stretched(self, p: Plan) -> Plan:
        # Only a plan that repeats the last one is stretched: after a change (a pod woke, went
        # idle, started), demand is still settling and must be measured again a period later.
        self.stretched_for = None
        if not self._repeats(p):
            return p
        if self.quiet is not None and self.quiet(p):
            why = "quiet"
            period = max(p.period_us, QUIET_PERIOD_US)
        elif self.min_turn_us is not None:
            why = "turns"
            offline = [s for s in p.slices if s.pod_class is PodClass.OFFLINE and s.allocation > 0]
            edges = len(offline)
            if edges == 1 and not p.work_conserving and p.allocated < 1.0:
                edges = 2  # a lone capped pod is opened and closed once a period
            if edges < 2:
                return p
            period = max(p.period_us, round(edges * self.min_turn_us))
        else:
            return p
        if period == p.period_us:
            return p
        self.stretched += 1
        self.stretched_for = why
        return replace(p, period_us=period)

    def _repeats(self, p: Plan) -> bool:
        last = self.last_plan
        if last is None or len(last.slices) != len(p.slices):
            return False
        before = {s.pod: s.allocation for s in last.slices}
        return all(
            s.pod in before and abs(s.allocation - before[s.pod]) <= STEADY_TOLERANCE
            for s in p.slices
        )


class PeriodicControl:
    """Steps a :class:`ControlLoop` on a loop, at the end of each plan's (possibly stretched)
    period, and sooner when a pod with nothing planned wakes up: a stretched period must not
    keep it waiting longer than the configured one would."""

    def __init__(self, loop: Loop, control: ControlLoop) -> None:
        self.loop = loop
        self.control = control
        self.steps = 0
        self.steps_failed = 0
        self.errors: list[str] = []
        #: Why the last step failed, while steps fail.
        self.failing: str | None = None
        self._timer: Cancellable | None = None
        self._stepped_at: float | None = None
        self._next_at = math.inf

    def step(self) -> None:
        """Close the period now, start the next, and step again when it ends.

        A step that fails leaves no pod closed: the enforcer stands down (every pod open, every
        timeslice restored) until a step succeeds again, one configured period later. The failure
        is logged once, not at every retry.
        """
        self.cancel()
        now = self.loop.now
        elapsed = None if self._stepped_at is None else now - self._stepped_at
        period: float = self.control.gpu.period_us
        try:
            period = self.control.step(elapsed).period_us
            self.steps += 1
            if self.failing is not None:
                log.info("GPU %d: planning again", self.control.gpu.index)
                self.failing = None
        except Exception as error:
            message = str(error) if isinstance(error, QPolicyError) else repr(error)
            self.steps_failed += 1
            self.errors.append(message)
            del self.errors[:-10]
            if message != self.failing:
                self.failing = message
                log.warning(
                    "GPU %d: cannot plan, every pod left open: %s",
                    self.control.gpu.index,
                    message,
                    exc_info=not isinstance(error, QPolicyError),
                )
            self.control.last_plan = None
            self.control.enforcer.stand_down()
        self._stepped_at = now
        self._arm(now + period)

    def wake(self) -> None:
        """Step within a configured period from the last step (queued, never run inside)."""
        if self._stepped_at is None:
            return
        when = max(self._stepped_at + self.control.gpu.period_us, self.loop.now)
        if when < self._next_at:
            self.cancel()
            self._arm(when)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._next_at = math.inf

    def _arm(self, when: float) -> None:
        self._next_at = when
        self._timer = self.loop.at(when, self.step)
