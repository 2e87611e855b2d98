"""GPU time and activity of pods under the rm enforcer, from what a userspace enforcer can see.

Time comes from when a pod's channels were open (the enforcer opened and closed them), less the
time it sat open idle; activity from what the probe counts per cgroup in libcuda: launches, and
waits for the GPU (synchronize calls, synchronous copies, queries answered "not ready";
NvProbe._activity).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Set as AbstractSet

from qpolicy.enforcers.rm.control import RmChannelControl
from qpolicy.enforcers.rm.resolver import PodResolver

log = logging.getLogger(__name__)


class RmUsageSensor:
    """GPU time from open intervals (less the time an idle pod sits open); activity from
    libcuda launches and waits seen by the probe.

    A pod is idle once its channels have been open for the grace without it launching or
    waiting for its GPU work (a loop of long kernels launches nothing while each runs). Only open
    time counts: a closed pod cannot make progress, so its process may be waiting on work stuck
    behind the closed channels and launch nothing, and a long wait must not make it look idle.
    A pod that launches while closed (launching needs no open channel) is busy again at once.
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
        self.throttled_us: dict[str, float] = {}
        self.polls = 0

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
                continue
            before = self._open_idle[pod]
            self._open_idle[pod] = before + delta
            # An idle pod is left open; time it sits open past the grace is not GPU time.
            past_grace = min(delta, before + delta - self.grace_us)
            if past_grace > 0:
                self._unused[pod] = self._unused.get(pod, 0.0) + past_grace
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
