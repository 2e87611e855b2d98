"""Time for everything that schedules: clocks, timers, loops and the control worker.

Neutral ground: the daemon runs on :class:`~qpolicy.runtime.realtime.RealtimeLoop`, the simulator
and the tests on :class:`~qpolicy.runtime.virtual.EventLoop` (virtual time). Both satisfy the
protocols in :mod:`qpolicy.runtime.clock`, so the control loop and the slice scheduler never know
which one they run on. Time is in microseconds everywhere.
"""
