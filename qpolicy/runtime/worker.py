"""Blocking driver controls, run one after another on their own thread.

RM controls block for ~0.6 ms each (docs/gpu-measurements.md), so they run on a
:class:`ControlWorker` thread in the order they were issued, and the loop thread only estimates when
they will have acted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from qpolicy.runtime.clock import Loop
from qpolicy.runtime.threads import NamedThread

log = logging.getLogger(__name__)

US = 1_000_000.0
# A job that keeps failing is logged at most this often.
ERROR_LOG_EVERY_S = 60.0


class Worker(Protocol):
    """Runs control jobs in order; see :class:`ControlWorker`."""

    latency_us: float

    def submit(self, job: Callable[[], float]) -> None: ...

    def settled_at(self) -> float: ...

    def drain(self, timeout_s: float = 5.0) -> bool: ...

    def close(self) -> None: ...


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
        self._logged_at = -ERROR_LOG_EVERY_S
        self._thread = NamedThread(self._run, "qpolicy-controls")
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
            except Exception:
                # Jobs report what RM refused themselves; what reaches here is a bug or an OS
                # error nobody expected. The worker must live on (queued opens still have to
                # go out), but the failure must be seen.
                sent = 0
                self.failed += 1
                now = time.monotonic()
                if now - self._logged_at >= ERROR_LOG_EVERY_S:
                    self._logged_at = now
                    log.exception("a driver control job failed (%d so far)", self.failed)
            elapsed_us = (time.perf_counter() - start) * US
            if sent > 0:
                per_control = elapsed_us / sent
                self.latency_us = 0.8 * self.latency_us + 0.2 * per_control
            with self._lock:
                self._pending -= 1
                self.done += 1
