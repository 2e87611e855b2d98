"""Runs the periods of a Plan by opening and closing pods' channels: the userspace slice scheduler.

Within a period (the model is CFS bandwidth control, with GPU time as the runtime):

* **online pods** keep their channels open from the period start and run whenever they have work;
  the plan's timeslices make the hardware hand them the GPU within one short offline timeslice.
  A capped online pod is closed once its GPU time reaches its cap.
* **offline pods** take exclusive **turns**, one pod's channels open at a time, so the hardware
  never pays for context switches between them (two competing contexts lose 7-35 % of the GPU,
  docs/gpu-measurements.md §3). A turn ends when the pod has used its planned GPU time
  (*budget*), when its part of the remaining wall time is over (*deadline*; a pod cannot starve
  the ones after it), or when the pod has gone idle. A pod found busy again within a grace of
  its idle turn's end takes the rest of that turn back at once (``_interrupts``).
* **work-conserving policies** then hand the rest of the period to offline pods that still have
  work, in proportion to their weights (burst-share: shares; best-effort: equal) in *burst* turns.

Controls act ``latency_us`` after they are issued, one after another, so a hand-over is issued ahead
of time. *Make before break* opens the next pod first and closes the current one a control later:
the GPU never waits for a control, and the two pods share the overlap as the hardware decides (the
simulator's default). *Break before make* closes the current pod first, so turns never overlap and
each pod's GPU time is the time its channels were open, at the price of one control of idle GPU per
switch (the rm enforcer's choice: on real hardware the overlap cannot be measured).

Two feedbacks keep achieved shares on the plan:

* planned GPU time a pod missed although its turn ran to its budget (it lost time to the control
  overlap or to online work) is carried into its next turn, bounded;
* deadlines split wall time by planned GPU time divided by each pod's measured *efficiency* (GPU
  time per wall second of its turns: a loop that synchronises often leaves gaps), so shares hold in
  GPU time, not in wall time.

The scheduler wakes only when something can change: a turn's end (a timer, the hand-over's lead
before it), the pod holding the GPU going idle (it cannot before its idle time reaches the grace:
looked at then), and every ``poll_us`` while a pod may wake up outside a turn (an idle pod left
open, idle GPU time a work-conserving policy may hand out). A sensor read on demand is read at
those wake-ups (:attr:`SliceScheduler.refresh`): the rm enforcer's loop costs CPU per wake-up, a
GSP control per change (BENCHMARKS.md, 2026-11-25). A look at the holder while every other planned
pod is offline, closed and busy asks for the holder alone: nothing another pod does can change
what the look decides (a closed pod cannot go idle), and the turn's end, which reads everyone,
comes at most a turn later; such a look that finds the holder still busy changes nothing and
skips the tick. Where nothing can be closed before the period ends (a work-conserving plan with
one offline pod at most and no online cap), there are no looks at all: the period's end reads
the sensor.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal

from qpolicy.enforcer import PodUsage
from qpolicy.enforcers.levers import ChannelControl, UsageSensor
from qpolicy.engine import Plan
from qpolicy.model import PodClass
from qpolicy.runtime.clock import Cancellable, Clock

log = logging.getLogger(__name__)

Handover = Literal["make-before-break", "break-before-make"]

_BUDGET = "budget"
_DEADLINE = "deadline"
_IDLE = "idle"
# Handed back to the pod whose idle turn it followed, which was found busy (_close_woken).
_INTERRUPTED = "interrupted"
# The shortest wait for a read the sensor asks for (sensor_due).
SENSOR_GAP_US = 500.0
_SKIPPED = "skipped"


def nothing_to_gate(plan: Plan, *, caps_hold: bool) -> bool:
    """Whether nothing a sensor could show would make the scheduler close a pod of ``plan``
    before its period ends: a work-conserving plan with one offline pod at most (never closed
    for another's turn; online work preempts it through the timeslices) and no online pod
    capped where ``caps_hold`` (a sensor that measures GPU time exactly; the rm enforcer's
    launch counters do not). Looks between the period's steps would then only cost CPU (an
    online pod and one trainer: 20 looks a second, BENCHMARKS.md 2026-12-07, fifty-sixth
    session)."""
    offline = sum(s.pod_class is PodClass.OFFLINE for s in plan.slices)
    capped = any(s.cap is not None for s in plan.slices if s.pod_class is PodClass.ONLINE)
    return plan.work_conserving and offline <= 1 and not (caps_hold and capped)


@dataclass(slots=True)
class _Turn:
    pod: str
    target_us: float
    burst: bool
    # The most the pod may use in this turn; target_us may be smaller (see SliceScheduler._fit).
    cap_us: float = math.inf
    start_gpu_us: float = 0.0
    owns_gpu_at: float = 0.0
    deadline: float = 0.0
    end: str | None = None
    closed_at: float | None = None
    # The rest of a turn of the pod's earlier in the period, not planned time of its own.
    resumed: bool = False


@dataclass(slots=True)
class _Online:
    pod: str
    cap_us: float | None
    throttled: bool = False


@dataclass(slots=True)
class SlicerStats:
    periods: int = 0
    turns: int = 0
    switches: int = 0
    throttles: int = 0
    #: Turns ended early for the pod whose idle turn they followed (_close_woken).
    interrupts: int = 0
    #: Turns of ended periods by how they ended ("budget", "deadline", "idle", "interrupted",
    #: "skipped", "not reached" where the period ended first), burst turns apart ("burst idle"),
    #: counted as the next period starts: why a node hands the GPU over as often as it does,
    #: without debug logs.
    ends: dict[str, int] = field(default_factory=dict)


class SliceScheduler:
    def __init__(
        self,
        clock: Clock,
        control: ChannelControl,
        sensor: UsageSensor,
        *,
        idle_grace_us: float = 500.0,
        poll_us: float = 1000.0,
        max_carry: float = 0.1,
        handover: Handover = "make-before-break",
        context_switch_us: float = 150.0,
    ) -> None:
        self.clock = clock
        self.control = control
        self.sensor = sensor
        self.idle_grace_us = idle_grace_us
        self.poll_us = poll_us
        self.max_carry = max_carry
        self.handover = handover
        self.context_switch_us = context_switch_us
        self.stats = SlicerStats()
        self._plan: Plan | None = None
        self._period_end = 0.0
        self._start_gpu: dict[str, float] = {}
        self._enabled: dict[str, bool] = {}
        self._timeslice: dict[str, int | None] = {}
        self._online: list[_Online] = []
        self._turns: list[_Turn] = []
        self._turn_index = 0
        self._burst_started = False
        self._carry: dict[str, float] = {}
        self._efficiency: dict[str, float] = {}
        self._wake: Cancellable | None = None
        #: Called before each look the scheduler's own timer wakes it for: a sensor that is read
        #: on demand is then read only when something can change (see :meth:`_look_at`); with
        #: the pods it needs fresh, or None for all.
        self.refresh: Callable[[AbstractSet[str] | None], None] | None = None
        # The look a tick schedules, (pod, when); and the pod whose counters alone the next
        # wake-up reads, where that look is what it wakes for and nobody else can change.
        self._look: tuple[str, float] | None = None
        self._read_alone: str | None = None
        # What a look that finds the holder still busy leaves standing: the holder's turn, its
        # successor and the GPU time it may use (its end is recomputed at each look, as the tick
        # does: its time starts when its open settles, and so does the hand-over's lead), and
        # when anything else falls due.
        self._turn_end: tuple[_Turn, str | None, float] | None = None
        self._alone_due = math.inf
        self.wakeups = 0
        #: Looks at the holder that found it still busy and changed nothing (:meth:`_look_again`).
        self.quick_looks = 0
        #: When the sensor next needs a read of its own (a check of an idle pod on the GPU;
        #: math.inf: never): the scheduler wakes then too, with a full read.
        self.sensor_due: Callable[[], float] | None = None
        #: Called when an offline pod with nothing planned this period starts launching.
        self.on_wake: Callable[[], None] | None = None
        self._woken: set[str] = set()

    # -- the period interface ------------------------------------------------------------------

    def collect(self) -> dict[str, PodUsage]:
        """Close the running period: usage per planned pod, and the feedback for the next one."""
        plan = self._plan
        if plan is None:
            return {}
        now = self.clock.now
        turn = self._current_turn()
        if turn is not None and turn.end is None:
            turn.end = _DEADLINE if self._busy(turn.pod) else _IDLE
            turn.closed_at = now
        usage: dict[str, PodUsage] = {}
        for s in plan.slices:
            used = self.sensor.gpu_time_us(s.pod) - self._start_gpu.get(s.pod, 0.0)
            turns = [t for t in self._turns if t.pod == s.pod]
            if s.pod_class is PodClass.ONLINE:
                hungry = any(o.pod == s.pod and o.throttled for o in self._online)
            elif s.pod in self._woken:
                hungry = True
            elif turns:
                # A turn still to come (the period was cut short) leaves a busy pod hungry.
                last = turns[-1].end
                hungry = last in (_BUDGET, _DEADLINE) or (last is None and self._busy(s.pod))
            else:
                hungry = self._busy(s.pod)
            usage[s.pod] = PodUsage(used_us=max(used, 0.0), hungry=hungry)
            self._learn(plan, s.pod, turns)
        return usage

    def apply(self, plan: Plan) -> None:
        """Start a period of ``plan`` now."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        now = self.clock.now
        # The closing period's turns, once each (collect() may be asked more than once).
        for t in self._turns:
            key = ("burst " if t.burst else "") + (t.end or "not reached")
            self.stats.ends[key] = self.stats.ends.get(key, 0) + 1
        self._plan = plan
        self.stats.periods += 1
        self._period_end = now + plan.period_us
        self._let_go({s.pod for s in plan.slices})
        self._start_gpu = {s.pod: self.sensor.gpu_time_us(s.pod) for s in plan.slices}
        self._burst_started = False

        for s in plan.slices:
            if self._timeslice.get(s.pod) != s.timeslice_us:
                self.control.set_timeslice(s.pod, s.timeslice_us)
                self._timeslice[s.pod] = s.timeslice_us

        period = plan.period_us
        self._online = [
            _Online(s.pod, None if s.cap is None or not self.sensor.exact else s.cap * period)
            for s in plan.slices
            if s.pod_class is PodClass.ONLINE
        ]
        for o in self._online:
            if o.cap_us is not None and o.cap_us <= self.control.latency_us:
                o.throttled = True
            self._set_enabled(o.pod, not o.throttled)

        turns = [
            _Turn(s.pod, max(s.allocation * period + self._carry.get(s.pod, 0.0), 0.0), False)
            for s in plan.slices
            if s.pod_class is PodClass.OFFLINE and s.allocation > 0
        ]
        # Start with whoever holds the GPU already: that saves a switch at every period boundary.
        # A pod that waited through the last period without a turn goes first, though: handing
        # the GPU back within one period matters more than the switch.
        had_turn = {t.pod for t in self._turns if t.end != _SKIPPED}
        waited = [
            i
            for i, t in enumerate(turns)
            if t.pod in self._woken
            or (self._turns and t.pod not in had_turn and not self._enabled.get(t.pod, True))
        ]
        self._woken = set()
        continuing = False
        if waited:
            turns = turns[waited[0] :] + turns[: waited[0]]
        else:
            for index, turn in enumerate(turns):
                if self._enabled.get(turn.pod, True):
                    turns = turns[index:] + turns[:index]
                    continuing = True
                    break
        self._fit(turns, period, switches=max(len(turns) - 1, 0) + (0 if continuing else 1))
        self._turns = turns
        self._turn_index = 0
        first = turns[0].pod if turns else None
        others = [s.pod for s in plan.slices if s.pod_class is PodClass.OFFLINE and s.pod != first]
        if self.handover == "break-before-make":
            for pod in others:
                self._step_aside(pod)
        if turns:
            self._open_turn(turns[0], now, previous=None)
        if self.handover == "make-before-break":
            for pod in others:
                self._step_aside(pod)
        self._tick()

    def _let_go(self, planned: AbstractSet[str]) -> None:
        """Give back what the scheduler holds of pods that are no longer planned here.

        A pod removed from the desired state, or moved to another GPU, while its channels were
        closed would otherwise stay closed (and keep its short timeslice) until the daemon exits.
        """
        for pod in [p for p in self._enabled if p not in planned]:
            if not self._enabled.pop(pod):
                self.control.set_enabled(pod, True)
        for pod in [p for p in self._timeslice if p not in planned]:
            if self._timeslice.pop(pod) is not None:
                self.control.set_timeslice(pod, None)
        for table in (self._carry, self._efficiency):
            for pod in [p for p in table if p not in planned]:
                del table[pod]
        self._woken &= planned

    def _fit(self, turns: list[_Turn], period: float, switches: int) -> None:
        """Shrink the turns of a period they over-commit by what its switches will cost.

        Fixed-share 70/30 plans the whole period; each switch then loses a context switch (and,
        breaking before making, a control) of GPU time. Left alone the turn that meets the period
        end absorbs it all; scaled, every pod loses the same fraction, and turns end on their
        budget, where missed time is carried forward.
        """
        if not turns:
            return
        per_switch = self.context_switch_us + (
            self.control.latency_us if self.handover == "break-before-make" else 0.0
        )
        available = period - switches * per_switch
        total = sum(turn.target_us for turn in turns)
        for turn in turns:
            turn.cap_us = turn.target_us
        if total > available > 0:
            scale = available / total
            for turn in turns:
                turn.target_us *= scale

    def release(self) -> None:
        """Open every pod the scheduler closed and restore the timeslices it changed."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        for pod, enabled in list(self._enabled.items()):
            if not enabled:
                self._set_enabled(pod, True)
        for pod, timeslice in list(self._timeslice.items()):
            if timeslice is not None:
                self.control.set_timeslice(pod, None)
                self._timeslice[pod] = None
        self._plan = None

    # -- feedback ------------------------------------------------------------------------------

    def _learn(self, plan: Plan, pod: str, turns: list[_Turn]) -> None:
        """Update ``pod``'s carried time and efficiency from its turns of the ending period."""
        self._carry.pop(pod, None)
        for index, turn in enumerate(turns):
            later = turns[index + 1] if index + 1 < len(turns) else None
            end_gpu = later.start_gpu_us if later else self.sensor.gpu_time_us(pod)
            used = end_gpu - turn.start_gpu_us
            if turn.end == _BUDGET and not turn.burst:
                limit = self.max_carry * plan.period_us
                self._carry[pod] = min(max(turn.target_us - used, -limit), limit)
            wall = (turn.closed_at or self.clock.now) - turn.owns_gpu_at
            # Only turns that wanted the GPU throughout say how well the pod uses it.
            if turn.end in (_BUDGET, _DEADLINE) and wall > 4 * self.control.latency_us:
                measured = min(max(used / wall, 0.25), 1.0)
                previous = self._efficiency.get(pod, measured)
                self._efficiency[pod] = 0.5 * previous + 0.5 * measured

    # -- inside a period -----------------------------------------------------------------------

    def observe(self) -> None:
        """Fresh usage is in: look at the turns now.

        For a sensor that is polled anyway: the scheduler then needs no polling timer of its own
        (``poll_us`` infinite), and each poll costs one wake-up of the loop, not two.
        """
        if self._wake is not None:
            self._wake.cancel()
        self._tick()

    def _on_timer(self) -> None:
        self.wakeups += 1
        alone = self._read_alone
        if self.refresh is None:
            # A sensor that is always fresh (the simulator's) was not read for the holder
            # alone: everything it says may have changed, so the tick looks at everything.
            self._tick()
            return
        self.refresh(None if alone is None else frozenset((alone,)))
        if alone is not None and self._busy(alone):
            due = self._alone_due
            if self._turn_end is not None:
                turn, successor, limit = self._turn_end
                used = self.sensor.gpu_time_us(turn.pod) - turn.start_gpu_us
                end = min(self.clock.now + limit - used, turn.deadline)
                due = min(due, end - self._lead(successor, turn))
            if self.clock.now < due:
                self._look_again(alone, due)
                return
        self._tick()

    def _look_again(self, holder: str, due: float) -> None:
        """A look at the holder alone found it still busy: the last tick's decisions stand.

        The look was read alone because every other planned pod is offline, closed and busy, so
        nothing but the holder going idle could change them: its turn's end is where the tick
        put it (a busy holder's GPU time grows with wall time, so its budget ends when it did;
        its successor is still busy; there is no online pod to throttle). Only the next look
        moves. On a GSP host most of the loop's wake-ups are these (15 of 20 a second with ten
        busy pods), and a full tick walks every pod several times.
        """
        self.quick_looks += 1
        now = self.clock.now
        look = self._look_at(holder, now)
        wake = min(look, due)
        self._read_alone = holder if wake == look else None
        self._wake = (
            self.clock.at(max(wake, now), self._on_timer) if wake < self._period_end else None
        )

    def _tick(self) -> None:
        self._wake = None
        self._look = None
        self._read_alone = None
        plan = self._plan
        if plan is None:
            return
        now = self.clock.now
        wake = math.inf
        self._turn_end = None
        latency = self.control.latency_us
        for o in self._online:
            if o.cap_us is None or o.throttled:
                continue
            left = o.cap_us - (self.sensor.gpu_time_us(o.pod) - self._start_gpu[o.pod])
            if left <= latency:
                o.throttled = True
                self.stats.throttles += 1
                self._set_enabled(o.pod, False)
            else:
                wake = min(wake, now + left - latency)
        due = wake  # online caps; there are none when the holder is read alone
        wake = min(wake, self._advance_turns(plan, now))
        interrupts = self.stats.interrupts
        if not self.nothing_to_gate(plan) and self._close_woken(plan, now):
            wake = min(wake, now + self.poll_us)
        if self.stats.interrupts != interrupts:
            # A turn was handed back: the new holder's end and looks replace the old one's.
            self._turn_end = None
            self._look = None
            wake = min(wake, self._advance_turns(plan, now))
        if self.sensor_due is not None:
            # Never sooner than the smallest wait: a read in flight settles a control later.
            wake = min(wake, max(self.sensor_due(), now + SENSOR_GAP_US))
        if wake < self._period_end:
            look = self._look
            if look is not None and wake == look[1] and self._others_settled(plan, look[0]):
                self._read_alone = look[0]
                self._alone_due = due
            self._wake = self.clock.at(max(wake, now), self._on_timer)

    def _others_settled(self, plan: Plan, holder: str) -> bool:
        """Whether every planned pod but ``holder`` is offline, closed and busy: then only the
        holder's activity can change what a look at it decides."""
        return all(
            s.pod == holder
            or (
                s.pod_class is PodClass.OFFLINE
                and not self._enabled.get(s.pod, True)
                and self._busy(s.pod)
            )
            for s in plan.slices
        )

    def nothing_to_gate(self, plan: Plan) -> bool:
        """:func:`nothing_to_gate` for this scheduler's sensor (online caps hold only where it
        measures GPU time exactly)."""
        return nothing_to_gate(plan, caps_hold=self.sensor.exact)

    def _advance_turns(self, plan: Plan, now: float) -> float:
        """Move the offline turns along; return when to look again."""
        quiet = self.nothing_to_gate(plan)
        while True:
            turn = self._current_turn()
            if turn is None:
                if plan.work_conserving and self._start_burst(plan, now):
                    self._open_turn(self._turns[self._turn_index], now, previous=None)
                    continue
                # Until the period ends, a pod that wakes up may still claim the idle time.
                return now + self.poll_us if plan.work_conserving and not quiet else math.inf
            used = self.sensor.gpu_time_us(turn.pod) - turn.start_gpu_us
            idle = now >= turn.owns_gpu_at and not self._busy(turn.pod)
            successor = self._peek_successor(plan, now, turn)
            # Handing over keeps to the target; with nobody to hand over to, only the cap binds.
            limit = turn.target_us if successor is not None else turn.cap_us
            by_budget = now + limit - used
            end = min(by_budget, turn.deadline)
            if successor is None and not idle:
                if plan.work_conserving:
                    # Nobody else wants the GPU: keep it, and notice when it goes idle (where
                    # another pod could then be given the GPU).
                    return math.inf if quiet else self._look_at(turn.pod, now)
                if end >= self._period_end:
                    # Runs to the period end; the next period decides who goes on.
                    return math.inf
            lead = self._lead(successor, turn)
            if not idle and now < end - lead:
                if successor == turn.pod and not self._others_busy(plan, turn.pod):
                    # Its turn ends into a burst of its own: nothing is sent then, so its end
                    # is taken at the next look, not woken for (a trainer next to an online pod
                    # would be looked at twice a period), or at the period's end where no
                    # other pod could be given the GPU.
                    return math.inf if quiet else self._look_at(turn.pod, now)
                self._turn_end = (turn, successor, limit)
                return min(end - lead, self._look_at(turn.pod, now))
            turn.end = _IDLE if idle else (_BUDGET if by_budget <= turn.deadline else _DEADLINE)
            self._hand_over(plan, turn, now)

    def _current_turn(self) -> _Turn | None:
        if self._turn_index < len(self._turns):
            return self._turns[self._turn_index]
        return None

    def _busy(self, pod: str) -> bool:
        return self.sensor.idle_for_us(pod) < self.idle_grace_us

    def _others_busy(self, plan: Plan, pod: str) -> bool:
        return any(self._busy(other) for other in self._offline_pods(plan) if other != pod)

    def _look_at(self, pod: str, now: float) -> float:
        """When to look again at a busy pod holding the GPU, to notice it going idle.

        It cannot be idle before its idle time reaches the grace, so there is no point looking
        sooner (never sooner than ``poll_us`` either). A pod that keeps launching is then looked at
        once a grace, and one that stops is seen idle within two graces of its last launch.
        """
        when = now + max(self.poll_us, self.idle_grace_us - self.sensor.idle_for_us(pod))
        self._look = (pod, when)
        return when

    def _peek_successor(self, plan: Plan, now: float, turn: _Turn) -> str | None:
        """The pod whose turn follows ``turn`` if it ended now (without changing anything)."""
        for later in self._turns[self._turn_index + 1 :]:
            if self._busy(later.pod):
                return later.pod
        if not plan.work_conserving or self._burst_started:
            return None
        # A burst starts with the pod holding the GPU when it still has work.
        if self._busy(turn.pod):
            return turn.pod
        if not self._burst_possible(now):
            return None
        return next((pod for pod in self._offline_pods(plan) if self._busy(pod)), None)

    def _lead(self, successor: str | None, turn: _Turn) -> float:
        """How long before a turn's end its hand-over must be issued to act on time."""
        if successor == turn.pod:
            return 0.0
        backlog = max(self.control.settled_at() - self.clock.now, 0.0)
        # Only the close has to land at the turn's end; under make before break the next pod's
        # open goes in front of it.
        controls = 2 if successor is not None and self.handover == "make-before-break" else 1
        return backlog + self.control.latency_us * controls

    def _hand_over(self, plan: Plan, turn: _Turn, now: float) -> None:
        self._turn_index += 1
        while (nxt := self._current_turn()) is not None and not self._busy(nxt.pod):
            nxt.end = _SKIPPED
            self._turn_index += 1
        if nxt is None and plan.work_conserving and self._start_burst(plan, now):
            nxt = self._current_turn()
        if nxt is not None and nxt.pod == turn.pod:
            turn.closed_at = now
            self._open_turn(nxt, now, previous=turn.pod)
            return
        self._switch(turn, nxt, now)

    def _switch(self, turn: _Turn, nxt: _Turn | None, now: float) -> None:
        """Take ``turn``'s pod off the GPU and open ``nxt`` (if any), in the hand-over's order."""
        if nxt is not None and self.handover == "make-before-break":
            self._open_turn(nxt, now, previous=turn.pod)
            self._step_aside(turn.pod)
            turn.closed_at = self.control.settled_at()
            return
        self._step_aside(turn.pod)
        turn.closed_at = self.control.settled_at()
        if nxt is not None:
            self._open_turn(nxt, now, previous=turn.pod)

    def _open_turn(self, turn: _Turn, now: float, previous: str | None) -> None:
        """Open ``turn``'s channels (before the previous pod is closed) and set its deadline."""
        switching = previous is not None and previous != turn.pod
        self._set_enabled(turn.pod, True)
        if switching:
            self.stats.switches += 1
        self.stats.turns += 1
        turn.start_gpu_us = self.sensor.gpu_time_us(turn.pod)
        # Under make before break the previous pod's close still follows this open.
        closing_after = switching and self.handover == "make-before-break"
        turn.owns_gpu_at = self.control.settled_at() + (
            self.control.latency_us if closing_after else 0
        )
        start = min(max(turn.owns_gpu_at, now), self._period_end)
        # Wall time is split by how long each remaining turn needs for its GPU time.
        needs = {
            id(t): t.target_us / self._efficiency.get(t.pod, 1.0)
            for t in self._turns[self._turn_index :]
            if t.burst == turn.burst
        }
        total = sum(needs.values())
        fraction = needs[id(turn)] / total if total > 0 else 1.0
        turn.deadline = start + (self._period_end - start) * fraction

    def _burst_possible(self, now: float) -> bool:
        return not self._burst_started and self._period_end - now > 2 * self.control.latency_us

    def _start_burst(self, plan: Plan, now: float) -> bool:
        """Queue burst turns that share the rest of the period among offline pods with work."""
        if self._burst_started:
            return False
        busy = [pod for pod in self._offline_pods(plan) if self._busy(pod)]
        # The pod holding the GPU goes first: no switch.
        busy.sort(key=lambda pod: not self._enabled.get(pod, True))
        if not self._burst_possible(now):
            # Too late to switch; the pod holding the GPU may still use the rest.
            busy = busy[:1] if busy and self._enabled.get(busy[0], True) else []
        weights = {s.pod: s.weight for s in plan.slices}
        left = self._period_end - now
        if len(busy) > 1:
            # A burst turn shorter than twice what its switch costs gives the pod less GPU time
            # than the switch takes from everyone (at the end of a period whose turns all ran,
            # ten pods would each be opened and closed for a fraction of a millisecond): the pod
            # holding the GPU keeps such crumbs.
            total = sum(weights[pod] for pod in busy)
            worth = 2 * (self.context_switch_us + self.control.latency_us)
            holder = busy[0] if self._enabled.get(busy[0], True) else None
            busy = [p for p in busy if p == holder or left * weights[p] / total >= worth]
        if not busy:
            return False
        total = sum(weights[pod] for pod in busy)
        self._burst_started = True
        self._turns.extend(_Turn(pod, left * weights[pod] / total, True) for pod in busy)
        return True

    @staticmethod
    def _offline_pods(plan: Plan) -> list[str]:
        return [s.pod for s in plan.slices if s.pod_class is PodClass.OFFLINE]

    def _step_aside(self, pod: str) -> None:
        """Take an offline pod off the GPU outside its turn: close it if it has work.

        An idle pod stays open. Closing it would gain nothing, and "idle" only means it launched
        no kernel for a while: a process creating its context or copying data has GPU work that
        is not a launch, and closed it could wait forever for a turn it is never judged to need.
        """
        self._set_enabled(pod, not self._busy(pod))

    def _close_woken(self, plan: Plan, now: float) -> bool:
        """Deal with idle offline pods, left open, that started launching outside a turn.

        One whose turn this period was skipped or ended idle gets the rest of it back: at once
        if nobody holds the GPU, or if the turn it ended is the one just before the holder's
        and it woke within a grace of that hand-over (:meth:`_interrupts`); else after the
        turns queued. Any other is closed until its next turn. True while a pod is open outside
        a turn, so that ticks keep watching it.
        """
        watching = False
        for pod in self._offline_pods(plan):
            turn = self._current_turn()
            if (turn is not None and pod == turn.pod) or not self._enabled.get(pod, True):
                continue
            if not self._busy(pod):
                watching = True
                continue
            left = self._unused_turn_time(pod)
            if left > 2 * self.control.latency_us:
                rest = _Turn(pod, left, False, resumed=True)
                if turn is not None and self._interrupts(pod, turn, now):
                    self._interrupt(turn, rest, now)
                    continue
                self._turns.append(rest)
                if turn is None:
                    self._open_turn(self._turns[self._turn_index], now, previous=None)
                    watching = True
                    continue
            else:
                # Nothing planned for it this period: it is hungry, it goes first next period,
                # and the loop may want to plan again sooner.
                self._woken.add(pod)
                if self.on_wake is not None:
                    self.on_wake()
            self._set_enabled(pod, False)
        return watching

    def _interrupts(self, pod: str, turn: _Turn, now: float) -> bool:
        """Whether ``pod``, busy again, takes the GPU back from ``turn`` at once.

        It does when its own turn ended idle just before ``turn`` began, within a grace: "idle"
        was then most likely a process with a kernel running and nothing to call meanwhile
        (host work between its launch and its wait), which a GPU check finds about 10 ms later
        (BENCHMARKS.md, 2026-11-28). Left to wait behind ``turn``, whose deadline was set with
        nobody after it, such a loop lost the rest of its turn for the period (an 80 ms host
        step per 0.1 s kernel, 7-9 % behind native time-slicing on an H100 and an H200). Woken
        later, it waits its turn: a pod that stops and starts at will should not cut into
        everyone's turns.
        """
        if self._turn_index == 0:
            return False
        ended = self._turns[self._turn_index - 1]
        return (
            ended.pod == pod
            and ended.end == _IDLE
            and ended.closed_at is not None
            and now - ended.closed_at <= self.idle_grace_us
        )

    def _interrupt(self, turn: _Turn, rest: _Turn, now: float) -> None:
        """End ``turn`` now for ``rest``; what ``turn`` had left follows ``rest``."""
        used = self.sensor.gpu_time_us(turn.pod) - turn.start_gpu_us
        remainder = _Turn(
            turn.pod,
            max(turn.target_us - used, 0.0),
            turn.burst,
            cap_us=max(turn.cap_us - used, 0.0),
            resumed=True,
        )
        turn.end = _INTERRUPTED
        self._turns[self._turn_index + 1 : self._turn_index + 1] = [rest, remainder]
        self._turn_index += 1
        self.stats.interrupts += 1
        log.debug(
            "pod %s: turn handed back by %s (%.1f ms left of %.1f planned)",
            rest.pod,
            turn.pod,
            rest.target_us / 1000,
            sum(t.target_us for t in self._turns if t.pod == rest.pod and not t.resumed) / 1000,
        )
        self._switch(turn, rest, now)

    def _unused_turn_time(self, pod: str) -> float:
        """What is left of ``pod``'s turns this period if they all ended early for idleness."""
        own = [t for t in self._turns if t.pod == pod and not t.burst]
        if not own or any(t.end not in (_SKIPPED, _IDLE) for t in own):
            return 0.0
        used = self.sensor.gpu_time_us(pod) - self._start_gpu.get(pod, 0.0)
        # What it was planned, not again the rests it was handed back (each counted in used).
        return sum(t.target_us for t in own if not t.resumed) - used

    def _set_enabled(self, pod: str, enabled: bool) -> None:
        if self._enabled.get(pod, True) == enabled:
            return
        self._enabled[pod] = enabled
        self.control.set_enabled(pod, enabled)
