"""Real time for the hardware enforcers: one loop thread for timers, one worker for controls.

The slice scheduler is single-threaded by design: every timer callback, period step and probe poll
runs on the :class:`RealtimeLoop` thread. RM controls block for ~0.6 ms each, so they run on a
:class:`ControlWorker` thread in the order they were issued, and the loop only estimates when
they will have acted.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from qpolicy.sim.events import Timer

US = 1_000_000.0


class Loop(Protocol):
    """What runs on a loop thread needs of it (the real one, or a virtual one in tests)."""

    @property
    def now(self) -> float: ...

    def at(self, when: float, callback: Callable[[], None]) -> Timer: ...

    def every(self, interval_us: float, callback: Callable[[], None]) -> Repeating: ...


class Worker(Protocol):
    """Runs control jobs in order; see :class:`ControlWorker`."""

    latency_us: float

    def submit(self, job: Callable[[], float]) -> None: ...

    def settled_at(self) -> float: ...

    def drain(self, timeout_s: float = 5.0) -> bool: ...

    def close(self) -> None: ...


class Repeating:
    """A handle on :meth:`RealtimeLoop.every`; :meth:`cancel` stops it."""

    def __init__(self) -> None:
        self.cancelled = False
        self.timer: Timer | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


class RealtimeLoop:
    """Runs callbacks at monotonic times (µs), on the thread that calls :meth:`run`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queue: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()

    @property
    def now(self) -> float:
        return self._clock() * US

    def at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        with self._lock:
            self._seq += 1
            heapq.heappush(self._queue, (when, self._seq, timer))
        self._wake.set()
        return timer

    def after(self, delay_us: float, callback: Callable[[], None]) -> Timer:
        return self.at(self.now + delay_us, callback)

    def call_soon(self, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the loop thread as soon as possible (safe from any thread)."""
        return self.at(self.now, callback)

    def every(self, interval_us: float, callback: Callable[[], None]) -> Repeating:
        """Run ``callback`` every ``interval_us``, on a fixed grid that does not drift."""
        repeating = Repeating()

        def tick(when: float) -> None:
            if repeating.cancelled:
                return
            callback()
            following = when + interval_us
            now = self.now
            if following < now:  # fell behind (a slow callback): skip, do not bunch up
                following = now + interval_us
            repeating.timer = self.at(following, lambda: tick(following))

        first = self.now + interval_us
        repeating.timer = self.at(first, lambda: tick(first))
        return repeating

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Run timers until :meth:`stop`."""
        while not self._stop.is_set():
            with self._lock:
                due = self._queue[0][0] if self._queue else None
            now = self.now
            if due is None or due > now:
                timeout = None if due is None else (due - now) / US
                self._wake.wait(timeout)
                self._wake.clear()
                continue
            with self._lock:
                _, _, timer = heapq.heappop(self._queue)
            callback = timer.callback
            if callback is not None:
                timer.callback = None
                callback()


class ControlWorker:
    """Runs blocking controls one after another on its own thread.

    ``latency_us`` is a running estimate of one control's duration (seeded with the H200's 0.6 ms),
    so a caller can tell when what it has issued will have acted.
    """

    def __init__(self, loop: Loop, latency_us: float = 600.0) -> None:
        self.loop = loop
        self.latency_us = latency_us
        self._jobs: queue.SimpleQueue[Callable[[], float] | None] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self.done = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="qpolicy-controls", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], float]) -> None:
        """Queue ``job``; it returns how many controls it sent (each one refines the estimate)."""
        with self._lock:
            self._pending += 1
        self._jobs.put(job)

    def settled_at(self) -> float:
        with self._lock:
            pending = self._pending
        return self.loop.now + pending * self.latency_us

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    def drain(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued control has run (shutdown); False if that took too long."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending == 0:
                    return True
            time.sleep(0.001)
        return False

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            start = time.perf_counter()
            try:
                sent = job()
            except Exception:  # a control job reports its own errors; the worker must live on
                sent = 0
                self.failed += 1
            elapsed_us = (time.perf_counter() - start) * US
            if sent > 0:
                per_control = elapsed_us / sent
                self.latency_us = 0.8 * self.latency_us + 0.2 * per_control
            with self._lock:
                self._pending -= 1
                self.done += 1
