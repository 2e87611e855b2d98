"""The real-time loop and the control worker outlive what fails in them, and say what failed."""

from __future__ import annotations

import logging
import threading

import pytest

from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.runtime.worker import ControlWorker


def test_a_control_job_that_raises_is_logged_with_its_traceback_and_the_worker_lives_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = RealtimeLoop()
    worker = ControlWorker(loop)
    ran = threading.Event()

    def broken() -> float:
        raise OSError("EBADF on a borrowed descriptor")

    with caplog.at_level(logging.ERROR, "qpolicy.runtime.worker"):
        worker.submit(broken)
        worker.submit(broken)
        worker.submit(lambda: (ran.set(), 1.0)[1])
        assert worker.drain()
    worker.close()
    assert ran.is_set() and worker.failed == 2 and worker.done == 3
    # Logged once (not once per failure), with what failed and where.
    (record,) = caplog.records
    assert "a driver control job failed (1 so far)" in record.getMessage()
    assert record.exc_info is not None and "EBADF" in str(record.exc_info[1])


def test_a_callback_that_raises_does_not_stop_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    loop = RealtimeLoop()
    after: list[int] = []

    def broken() -> None:
        raise KeyError("gone")

    loop.call_soon(broken)
    loop.call_soon(lambda: after.append(1))
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, "qpolicy.runtime.realtime"):
        loop.run()
    assert after == [1] and loop.failures == 1
    assert "a scheduled callback failed (1 so far)" in caplog.records[0].getMessage()


class CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_timers_the_loop_schedules_itself_do_not_wake_it_and_other_threads_do() -> None:
    loop = RealtimeLoop()
    event = CountingEvent()
    loop._wake = event
    ticks = []

    def tick() -> None:
        ticks.append(loop.now)
        if len(ticks) < 20:
            loop.after(2_000, tick)  # the next one, 2 ms on, from the loop thread
        else:
            # Far off: only another thread's timer, sooner, ends the run in time.
            loop.after(60e6, loop.stop)
            threading.Timer(0.05, lambda: loop.call_soon(loop.stop)).start()

    loop.call_soon(tick)
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    runner.join(timeout=5)
    assert not runner.is_alive()
    assert len(ticks) == 20
    # One wait per timer (a timeout that ends a hair early may add one); setting the event for
    # each timer scheduled from the loop thread made that two.
    assert event.waits <= 20 + 10


def test_a_timer_with_slack_runs_with_another_wake_up_and_keeps_its_grid() -> None:
    """The daemon's refresh and publish run with whatever else wakes the loop (the rm
    enforcer's looks, period steps) in the last half of their interval: no wake-up of their own."""
    loop = RealtimeLoop()
    event = CountingEvent()
    loop._wake = event
    fast: list[float] = []
    lax: list[float] = []
    start = loop.now
    loop.every(30_000, lambda: fast.append(loop.now))
    loop.every(100_000, lambda: lax.append(loop.now), slack_us=50_000)
    threading.Timer(1.02, lambda: loop.call_soon(loop.stop)).start()
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    runner.join(timeout=5)
    assert not runner.is_alive()
    assert 9 <= len(lax) <= 10  # on its 100 ms grid, not drifting
    for k, ran in enumerate(lax, start=1):
        assert start + k * 100_000 - 50_000 <= ran <= start + k * 100_000 + 80_000
    # Each wait ends in a run of the fast timer (one that ends a hair early may add one): the
    # lax one never waited for itself (without slack: about 43 waits).
    assert event.waits <= len(fast) + 5
