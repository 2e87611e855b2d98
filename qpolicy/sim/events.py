"""The clock and event queue of the simulator (time in microseconds)."""

from __future__ import annotations

import heapq
from collections.abc import Callable


class Timer:
    """A scheduled callback; cancelling it leaves a tombstone the loop skips."""

    __slots__ = ("callback", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None

    @property
    def pending(self) -> bool:
        return self.callback is not None


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
