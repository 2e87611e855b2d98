"""GPU time and activity of pods under the rm enforcer, from what a userspace enforcer can see.

Time comes from when a pod's channels were open (the enforcer opened and closed them), less the
time it sat open idle; activity from what the probe counts per cgroup in libcuda: launches, and
waits for the GPU (synchronize calls, synchronous copies, queries answered "not ready";
NvProbe._activity), and from the GPU itself for a pod that reads idle while open: GR saving its
context mid-work.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from qpolicy.enforcers.rm.control import RmChannelControl, TsgKey
from qpolicy.enforcers.rm.resolver import PodResolver

log = logging.getLogger(__name__)


# A pod that reads idle while open is checked on the GPU this long after the first read, then
# at twice the interval each time nothing was found, up to the longest.
CHECK_FIRST_US = 5_000.0
CHECK_LONGEST_US = 1_600_000.0


@dataclass(slots=True)
class _Check:
    """The GPU check of one pod that reads idle while open (RmUsageSensor)."""

    #: The read the next one is compared with (None until the first settles, or refused).
    baseline: dict[TsgKey, int] | None = None
    #: The read in flight (its number), if any.
    pending: int | None = None
    #: When to read next, once nothing is in flight; and the wait after that.
    due: float = math.inf
    interval: float = CHECK_FIRST_US


def _interrupted(before: dict[TsgKey, int], after: dict[TsgKey, int]) -> int:
    """Preemption saves between two reads, over the TSGs both know."""
    return sum(max(after[key] - count, 0) for key, count in before.items() if key in after)


class RmUsageSensor:
    """GPU time from open intervals (less the time an idle pod sits open); activity from
    libcuda launches and waits seen by the probe.

    A pod is idle once its channels have been open for the grace without it launching or
    waiting for its GPU work (a loop of long kernels launches nothing while each runs). Only open
    time counts: a closed pod cannot make progress, so its process may be waiting on work stuck
    behind the closed channels and launch nothing, and a long wait must not make it look idle.
    A pod that launches while closed (launching needs no open channel) is busy again at once.

    Some work shows no call at all: a process that launched a long kernel and works on the host
    before it waits launches nothing and waits in nothing meanwhile, so it reads idle with its
    kernel still running. Left open beside the pod that gets the GPU, the two TSGs then switch
    at every short offline slice, and neither gets far (an 80 ms host step per 0.1 s kernel cost
    such a loop 12-20 % against native time-slicing on an H100 and an H200, BENCHMARKS.md
    2026-11-28). So a pod that reads idle while open is checked on the GPU: its TSGs' preemption
    saves are read when it goes idle and again ``CHECK_FIRST_US`` later (then at doubling
    intervals while it stays idle and open). A save in between means GR took it off the engine
    in the middle of work, which a context with nothing to run never is (it is saved by
    wait-for-idle): the pod is busy, and the scheduler closes it outside its turn. A pod with
    nothing to run beside it is not switched, and reads idle as before; that costs nobody.
    """

    # Open time is when a pod may run, not when it ran: an online pod that shares the GPU with
    # others is not capped from it (the offline timeslice keeps it ahead instead).
    exact = False

    def __init__(self, control: RmChannelControl, resolver: PodResolver, grace_us: float) -> None:
        self.control = control
        self.resolver = resolver
        self.grace_us = grace_us
        self._count: dict[str, int] = {}
        # Per pod: open time since its last launch, and the pod's open time, as of the last poll.
        self._open_idle: dict[str, float] = {}
        self._open_seen: dict[str, float] = {}
        # When the sensor was last read (for all pods or some), and each pod's last read.
        self._polled_at: float | None = None
        self._pod_polled_at: dict[str, float] = {}
        self._busy: dict[str, bool] = {}
        self._unused: dict[str, float] = {}
        # Per pod: the part of _unused from its present idle stretch (since its last launch),
        # charged back if the GPU check finds work of its running after all.
        self._stretch: dict[str, float] = {}
        self.throttled_us: dict[str, float] = {}
        self.polls = 0
        self._checks: dict[str, _Check] = {}
        #: Pods found busy by the GPU check, and the reads it made.
        self.found_running = 0
        self.check_reads = 0

    def poll(self, pods: AbstractSet[str] | None = None) -> None:
        """Read the launch counters of every pod, or of ``pods`` only (the others keep what
        the last read found; their time is accounted at their next read)."""
        self.polls += 1
        now = self.control.loop.now
        previous = self._polled_at if self._polled_at is not None else now
        self._polled_at = now
        launches = self.resolver.launches() if pods is None else self.resolver.launches_of(pods)
        for pod in launches:
            if pod not in self._count:
                self.control.track(pod)
        open_time, is_open_now = self.control.open_times_us()
        for pod, count in launches.items():
            opened = open_time.get(pod, 0.0)
            delta = opened - self._open_seen.get(pod, opened)
            self._open_seen[pod] = opened
            if count != self._count.get(pod):
                self._count[pod] = count
                self._open_idle[pod] = 0.0
                self._stretch[pod] = 0.0
                continue
            before = self._open_idle[pod]
            self._open_idle[pod] = before + delta
            # An idle pod is left open; time it sits open past the grace is not GPU time.
            past_grace = min(delta, before + delta - self.grace_us)
            if past_grace > 0:
                self._unused[pod] = self._unused.get(pod, 0.0) + past_grace
                self._stretch[pod] = self._stretch.get(pod, 0.0) + past_grace
        debug = log.isEnabledFor(logging.DEBUG)
        for pod in self._count if pods is None else [p for p in pods if p in self._count]:
            since = now - self._pod_polled_at.get(pod, previous)
            self._pod_polled_at[pod] = now
            # Unknown pods have never been touched: their channels are as the tenant left them.
            is_open = is_open_now.get(pod, True)
            seen = self._open_seen.get(pod)
            idle = self._open_idle[pod] + (
                open_time.get(pod, 0.0) - seen if seen is not None else 0.0
            )
            busy = idle < self.grace_us
            if busy or not is_open:
                self._checks.pop(pod, None)
            elif self._check(pod, now):
                busy = True
            if not is_open and busy:
                self.throttled_us[pod] = self.throttled_us.get(pod, 0.0) + since
            if busy != self._busy.get(pod) and debug:
                log.debug(
                    "pod %s: %s (%d launches, %s)",
                    pod,
                    "busy" if busy else "idle",
                    self._count[pod],
                    "open" if is_open else "closed",
                )
            self._busy[pod] = busy

    def _check(self, pod: str, now: float) -> bool:
        """Move the GPU check of ``pod``, idle and open: True once it found work running."""
        check = self._checks.get(pod)
        if check is None:
            # Read at the next wake-up, not now: a read queued ahead of the hand-over this read
            # of the sensor leads to would hold it back a control.
            self._checks[pod] = _Check(due=now)
            return False
        if check.pending is not None:
            read = self.control.preemptions(pod)
            if read is None or read[0] < check.pending:
                return False  # still in flight
            check.pending = None
            saves = read[1]
            if check.baseline is not None and saves is not None:
                interrupted = _interrupted(check.baseline, saves)
                if interrupted:
                    # Work of the pod's was running: busy from now, as after a launch, and
                    # charged for the open time it read idle (it was running all along: it
                    # launched nothing since). Left uncharged, a loop with host work between
                    # launch and wait had a third of its turns free (tests/unit/
                    # test_rm_enforcer.py, the host-work rig: 0.71 of the GPU at 50/50).
                    self._open_idle[pod] = 0.0
                    stretch = self._stretch.pop(pod, 0.0)
                    self._unused[pod] = self._unused.get(pod, 0.0) - stretch
                    del self._checks[pod]
                    self.found_running += 1
                    log.debug("pod %s: busy (%d preemption saves while idle)", pod, interrupted)
                    return True
                check.interval = min(2 * check.interval, CHECK_LONGEST_US)
            check.baseline = saves
            check.due = now + check.interval
            return False
        if now >= check.due:
            check.pending = self._read(pod)
            if check.pending is None:
                self._read_later(check, now)
        return False

    def _read_later(self, check: _Check, now: float) -> None:
        """Nothing could be read: no TSG of the pod's known yet (tried again at the longest
        interval), or RM refused the control (never again)."""
        refused = self.control.preemptions_refused is not None
        check.due = math.inf if refused else now + CHECK_LONGEST_US

    def checks(self) -> dict[str, int | None]:
        """What the GPU checks of idle pods did: reads sent, pods found with work running, and
        the status RM refused the read with (None: not refused)."""
        return {
            "reads": self.check_reads,
            "found_running": self.found_running,
            "refused": self.control.preemptions_refused,
        }

    def _read(self, pod: str) -> int | None:
        number = self.control.read_preemptions(pod)
        if number is not None:
            self.check_reads += 1
        return number

    def look_due_at(self) -> float:
        """When a GPU check next needs a read of the sensor: a read due, or one in flight to
        collect once the controls queued before it have settled, or a pod idle at the last
        read and without a check that is open once they have (stepped aside at a turn's end,
        an idle pod is left open) (math.inf: none)."""
        due = math.inf
        for pod, busy in self._busy.items():
            if not busy and pod not in self._checks and self.control.wanted_open(pod):
                due = min(due, self.control.settled_at())
        for check in self._checks.values():
            if check.pending is not None:
                due = min(due, self.control.settled_at())
            else:
                due = min(due, check.due)
        return due

    def gpu_time_us(self, pod: str) -> float:
        opened = self.control.open_time_us(pod)
        unused = self._unused.get(pod, 0.0)
        idle = self._open_idle.get(pod)
        if idle is not None:  # and the part past the grace since the last poll
            delta = opened - self._open_seen[pod]
            unused += max(0.0, min(delta, idle + delta - self.grace_us))
        return opened - unused

    def idle_for_us(self, pod: str) -> float:
        idle = self._open_idle.get(pod)
        if idle is None:
            return math.inf  # never launched anything
        return idle + self.control.open_time_us(pod) - self._open_seen[pod]
