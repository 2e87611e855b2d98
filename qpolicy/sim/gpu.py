"""One simulated GPU: contexts (TSGs) time-sliced by the hardware, channels that can be disabled.

The model follows what was measured on the H200 (docs/gpu-measurements.md §2-3):

* the GPU runs one context at a time and round-robins between *runnable* contexts (channels
  enabled and work queued); a context keeps the GPU until its work runs out or, when another
  context is runnable, until its timeslice ends; then it is preempted, mid-kernel if need be;
* loading a context other than the one last on the GPU costs ``switch_us`` of dead time;
* disabling a context's channels (FIFO_DISABLE_CHANNELS) stops it at once, enabling resumes it.

Time is in microseconds. Work is submitted as jobs of a known GPU duration; a job is the unit
between two host synchronisations (one batch of kernels, or one request).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from qpolicy.runtime.clock import Timer
from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.calibration import CONTEXT_SWITCH_US, HW_TIMESLICE_US

_EPS = 1e-6


class Job:
    __slots__ = ("on_done", "remaining", "started", "submitted_at")

    def __init__(
        self, work_us: float, on_done: Callable[[], None] | None, submitted_at: float
    ) -> None:
        self.remaining = work_us
        self.on_done = on_done
        self.submitted_at = submitted_at
        self.started = False


class Context:
    """A channel group of one process, as the GPU scheduler sees it."""

    __slots__ = (
        "blocked_since",
        "blocked_time",
        "enabled",
        "gpu_time",
        "idle_since",
        "index",
        "name",
        "queue",
        "submitted",
        "timeslice_us",
        "waits",
        "windows",
    )

    def __init__(self, name: str, index: int, timeslice_us: float) -> None:
        self.name = name
        self.index = index
        self.timeslice_us = timeslice_us
        self.enabled = True
        self.queue: deque[Job] = deque()
        self.gpu_time = 0.0
        self.windows: list[float] = []
        self.submitted = 0
        self.idle_since = 0.0
        # Time with work queued but channels disabled, and how long each job waited to start.
        self.blocked_time = 0.0
        self.blocked_since: float | None = None
        self.waits: list[float] = []

    @property
    def runnable(self) -> bool:
        return self.enabled and bool(self.queue)


class SimGpu:
    def __init__(
        self,
        loop: EventLoop,
        *,
        switch_us: float = CONTEXT_SWITCH_US,
        window_us: float = 1_000_000.0,
    ) -> None:
        self.loop = loop
        self.switch_us = switch_us
        self.window_us = window_us
        self.contexts: list[Context] = []
        self.switches = 0
        self._running: Context | None = None
        self._switching_to: Context | None = None
        self._loaded: Context | None = None
        self._last_index = -1
        self._seg_start = 0.0
        self._slice_start = 0.0
        self._slice_end = math.inf
        self._timer: Timer | None = None

    # -- the interface processes and controllers use -------------------------------------------

    def add_context(self, name: str, timeslice_us: float = HW_TIMESLICE_US) -> Context:
        ctx = Context(name, len(self.contexts), timeslice_us)
        ctx.idle_since = self.loop.now
        self.contexts.append(ctx)
        return ctx

    def submit(self, ctx: Context, work_us: float, on_done: Callable[[], None] | None) -> None:
        was_runnable = ctx.runnable
        ctx.queue.append(Job(work_us, on_done, self.loop.now))
        ctx.submitted += 1
        if not ctx.enabled and ctx.blocked_since is None:
            ctx.blocked_since = self.loop.now
        if not was_runnable and ctx.enabled:
            self._became_runnable(ctx)

    def set_enabled(self, ctx: Context, enabled: bool) -> None:
        if ctx.enabled == enabled:
            return
        ctx.enabled = enabled
        if enabled:
            if ctx.blocked_since is not None:
                ctx.blocked_time += self.loop.now - ctx.blocked_since
                ctx.blocked_since = None
            if ctx.queue:
                self._became_runnable(ctx)
            return
        if ctx.queue:
            ctx.blocked_since = self.loop.now
        if self._running is ctx:
            self._flush()
            self._stop_running()
            self._dispatch()
        elif self._switching_to is ctx:
            self._cancel_timer()
            self._switching_to = None
            # The half-done switch is wasted: whatever comes next pays a full one.
            self._loaded = None
            self._dispatch()

    def set_timeslice(self, ctx: Context, timeslice_us: float) -> None:
        ctx.timeslice_us = timeslice_us
        if self._running is ctx:
            self._flush()
            self._slice_start = self.loop.now
            self._arm()

    def gpu_time(self, ctx: Context) -> float:
        """GPU time ``ctx`` has used so far, including the segment now running."""
        if self._running is ctx:
            return ctx.gpu_time + (self.loop.now - self._seg_start)
        return ctx.gpu_time

    def blocked_time(self, ctx: Context) -> float:
        """How long ``ctx`` has had work while its channels were disabled."""
        since = ctx.blocked_since
        return ctx.blocked_time + (self.loop.now - since if since is not None else 0.0)

    def idle_for(self, ctx: Context) -> float:
        """How long ``ctx`` has had no work queued (0 while it has work)."""
        return 0.0 if ctx.queue else self.loop.now - ctx.idle_since

    def flush(self) -> None:
        """Bring the accounting of the running segment up to now (for reports)."""
        self._flush()

    @property
    def busy_time(self) -> float:
        return sum(self.gpu_time(ctx) for ctx in self.contexts)

    # -- the hardware scheduler ----------------------------------------------------------------

    def _became_runnable(self, ctx: Context) -> None:
        if self._running is None and self._switching_to is None:
            self._dispatch()
        elif self._running is not None and self._running is not ctx:
            # A competitor appeared: the running context now has to yield at its next timeslice end.
            self._flush()
            self._arm()

    def _has_competitor(self, ctx: Context) -> bool:
        return any(other.runnable for other in self.contexts if other is not ctx)

    def _dispatch(self) -> None:
        """Give the idle engine to the next runnable context in round-robin order."""
        count = len(self.contexts)
        for step in range(1, count + 1):
            ctx = self.contexts[(self._last_index + step) % count]
            if ctx.runnable:
                break
        else:
            return
        self._last_index = ctx.index
        if ctx is self._loaded:
            self._start_running(ctx)
            return
        self._switching_to = ctx
        self.switches += 1
        self._timer = self.loop.after(self.switch_us, self._switch_done)

    def _switch_done(self) -> None:
        ctx = self._switching_to
        self._switching_to = None
        self._timer = None
        if ctx is None:
            return
        self._loaded = ctx
        if ctx.runnable:
            self._start_running(ctx)
        else:
            self._dispatch()

    def _start_running(self, ctx: Context) -> None:
        self._running = ctx
        self._seg_start = self.loop.now
        self._slice_start = self.loop.now
        self._arm()

    def _arm(self) -> None:
        ctx = self._running
        assert ctx is not None
        self._cancel_timer()
        now = self.loop.now
        head = ctx.queue[0]
        if not head.started:
            # Every job starts through here: on a fresh segment or right after its predecessor.
            head.started = True
            ctx.waits.append(now - head.submitted_at)
        self._slice_end = math.inf
        if self._has_competitor(ctx):
            slices = math.floor((now - self._slice_start) / ctx.timeslice_us + _EPS) + 1
            self._slice_end = self._slice_start + slices * ctx.timeslice_us
        when = min(now + head.remaining, self._slice_end)
        self._timer = self.loop.at(when, self._segment_end)

    def _segment_end(self) -> None:
        self._timer = None
        ctx = self._running
        if ctx is None:
            return
        self._flush()
        finished: list[Callable[[], None]] = []
        while ctx.queue and ctx.queue[0].remaining <= _EPS:
            job = ctx.queue.popleft()
            if job.on_done is not None:
                finished.append(job.on_done)
        if not ctx.queue:
            ctx.idle_since = self.loop.now
            self._stop_running()
            self._dispatch()
        elif self.loop.now + _EPS >= self._slice_end and self._has_competitor(ctx):
            self._stop_running()
            self._dispatch()
        else:
            self._arm()
        # Completions run last, on a consistent scheduler, since they may submit more work.
        for callback in finished:
            callback()

    def _stop_running(self) -> None:
        self._cancel_timer()
        self._running = None

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        ctx = self._running
        if ctx is None:
            return
        now = self.loop.now
        elapsed = now - self._seg_start
        if elapsed <= 0:
            return
        ctx.gpu_time += elapsed
        ctx.queue[0].remaining -= elapsed
        self._charge(ctx, self._seg_start, now)
        self._seg_start = now

    def _charge(self, ctx: Context, start: float, end: float) -> None:
        width = self.window_us
        windows = ctx.windows
        first = int(start // width)
        last = int(end // width)
        if len(windows) <= last:
            windows.extend([0.0] * (last + 1 - len(windows)))
        if first == last:
            windows[first] += end - start
            return
        windows[first] += (first + 1) * width - start
        for index in range(first + 1, last):
            windows[index] += width
        windows[last] += end - last * width
