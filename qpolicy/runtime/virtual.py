"""Virtual time: an event queue that runs callbacks in time order, as fast as it can.

The simulator runs a GPU on it, and the tests run the control loop and the enforcers on it, so a
minute of periods takes milliseconds and every run is repeatable.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from qpolicy.runtime.clock import Repeating, Timer


class EventLoop:
    """Runs callbacks in time order; ties run in the order they were scheduled."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self.processed = 0

    def at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(max(when, self.now), callback)
        self._seq += 1
        heapq.heappush(self._queue, (timer.when, self._seq, timer))
        return timer

    def after(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.at(self.now + delay, callback)

    def every(self, interval_us: float, callback: Callable[[], None]) -> Repeating:
        """Run ``callback`` every ``interval_us`` from now on, until cancelled."""
        repeating = Repeating()

        def tick() -> None:
            if not repeating.cancelled:
                callback()
                repeating.timer = self.after(interval_us, tick)

        repeating.timer = self.after(interval_us, tick)
        return repeating

    def run_until(self, end: float) -> None:
        queue = self._queue
        while queue and queue[0][0] <= end:
            when, _, timer = heapq.heappop(queue)
            callback = timer.callback
            if callback is None:
                continue
            timer.callback = None
            self.now = when
            self.processed += 1
            callback()
        self.now = max(self.now, end)
