"""Real time: the daemon's loop thread.

The slice scheduler is single-threaded by design: every timer callback, period step and probe poll
runs on the :class:`RealtimeLoop` thread. Blocking driver controls run elsewhere
(:mod:`qpolicy.runtime.worker`).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from qpolicy.runtime.clock import Repeating, Timer

log = logging.getLogger(__name__)

US = 1_000_000.0
# A failing callback is logged at most this often.
ERROR_LOG_EVERY_S = 60.0


class RealtimeLoop:
    """Runs callbacks at monotonic times (µs), on the thread that calls :meth:`run`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queue: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.failures = 0
        self._logged_at = -ERROR_LOG_EVERY_S
        self._thread: int | None = None  # the thread in run()

    @property
    def now(self) -> float:
        return self._clock() * US

    def at(self, when: float, callback: Callable[[], None], slack_us: float = 0.0) -> Timer:
        """Run ``callback`` at ``when``, or up to ``slack_us`` sooner if the loop is awake then
        for another timer (one wake-up for both)."""
        timer = Timer(when, callback, slack_us)
        with self._lock:
            self._seq += 1
            heapq.heappush(self._queue, (when, self._seq, timer))
            first = self._queue[0][2] is timer
        # The loop thread looks at the queue again before it waits; another thread must wake it,
        # but only for a timer due before the one it waits for.
        if first and threading.get_ident() != self._thread:
            self._wake.set()
        return timer

    def after(self, delay_us: float, callback: Callable[[], None]) -> Timer:
        return self.at(self.now + delay_us, callback)

    def call_soon(self, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the loop thread as soon as possible (safe from any thread)."""
        return self.at(self.now, callback)

    def every(
        self, interval_us: float, callback: Callable[[], None], slack_us: float = 0.0
    ) -> Repeating:
        """Run ``callback`` every ``interval_us``, on a fixed grid that does not drift; each run
        may come up to ``slack_us`` early (see :meth:`at`)."""
        repeating = Repeating()

        def tick(when: float) -> None:
            if repeating.cancelled:
                return
            callback()
            following = when + interval_us
            now = self.now
            if following < now:  # fell behind (a slow callback): skip, do not bunch up
                following = now + interval_us
            repeating.timer = self.at(following, lambda: tick(following), slack_us)

        first = self.now + interval_us
        repeating.timer = self.at(first, lambda: tick(first), slack_us)
        return repeating

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Run timers until :meth:`stop`."""
        self._thread = threading.get_ident()
        awake = False  # a callback ran since the last wait: a timer with slack may join it
        while not self._stop.is_set():
            with self._lock:
                head = self._queue[0][2] if self._queue else None
            now = self.now
            if (
                head is not None
                and head.when > now
                and head.callback is not None
                and not (awake and head.when - now <= head.slack)
            ):
                awake = False
                self._wake.wait((head.when - now) / US)
                self._wake.clear()
                continue
            if head is None:
                awake = False
                self._wake.wait(None)
                self._wake.clear()
                continue
            with self._lock:
                if not self._queue or self._queue[0][2] is not head:
                    continue  # another thread queued a sooner one: look again
                heapq.heappop(self._queue)
            callback = head.callback
            if callback is not None:
                head.callback = None
                awake = True
                self._call(callback)

    def _call(self, callback: Callable[[], None]) -> None:
        # The daemon must outlive a bug in one of its callbacks: a period step that raises is
        # retried at the next one, and the log says what happened (at most once a minute).
        try:
            callback()
        except Exception:
            self.failures += 1
            now = time.monotonic()
            if now - self._logged_at >= ERROR_LOG_EVERY_S:
                self._logged_at = now
                log.exception("a scheduled callback failed (%d so far)", self.failures)
