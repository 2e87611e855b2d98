"""Simulated processes: a training loop that saturates the GPU, and an inference server.

Both behave like the PyTorch loops measured on the H200: a trainer submits ``sync_every`` kernels,
waits for them, and after a short host gap submits the next batch; a server receives requests,
launches each request's kernels on its stream; the request is done when its last kernel completes.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence

from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.calibration import (
    HOST_SYNC_GAP_US,
    REQUEST_LAUNCH_JITTER_MEAN_US,
    REQUEST_LAUNCH_US,
)
from qpolicy.sim.gpu import Context, SimGpu

Windows = Sequence[tuple[float, float]]


class Saturate:
    """``sync_every`` kernels of ``kernel_us``, synchronise, repeat, while a window is active."""

    def __init__(
        self,
        loop: EventLoop,
        gpu: SimGpu,
        ctx: Context,
        *,
        kernel_us: float,
        sync_every: int,
        active: Windows,
        host_gap_us: float = HOST_SYNC_GAP_US,
    ) -> None:
        self.loop = loop
        self.gpu = gpu
        self.ctx = ctx
        self.kernel_us = kernel_us
        self.sync_every = sync_every
        self.host_gap_us = host_gap_us
        self.active = list(active)
        self.kernels_done = 0
        self.launches = 0
        self._running = False
        for start, _ in self.active:
            loop.at(start, self._start)

    def _is_active(self) -> bool:
        now = self.loop.now
        return any(start <= now < end for start, end in self.active)

    def _start(self) -> None:
        if not self._running:
            self._running = True
            self._submit()

    def _submit(self) -> None:
        if not self._is_active():
            self._running = False
            return
        self.launches += self.sync_every
        self.gpu.submit(self.ctx, self.kernel_us * self.sync_every, self._batch_done)

    def _batch_done(self) -> None:
        self.kernels_done += self.sync_every
        self.loop.after(self.host_gap_us, self._submit)

    @property
    def latencies_us(self) -> list[float] | None:
        return None


class Requests:
    """Requests at ``rate_hz`` (fixed interval, or Poisson), each ``kernels`` kernels long.

    Latency runs from the request's arrival to the completion of its last kernel.
    """

    def __init__(
        self,
        loop: EventLoop,
        gpu: SimGpu,
        ctx: Context,
        *,
        rate_hz: float,
        kernels: int,
        kernel_us: float,
        poisson: bool,
        active: Windows,
        rng: random.Random,
    ) -> None:
        self.loop = loop
        self.gpu = gpu
        self.ctx = ctx
        self.interval_us = 1e6 / rate_hz
        self.kernels = kernels
        self.work_us = kernels * kernel_us
        self.poisson = poisson
        self.rng = rng
        self.kernels_done = 0
        self.launches = 0
        self.requests_done = 0
        self._latencies: list[float] = []
        self.arrivals: list[float] = []
        self._last_launch = 0.0
        for start, end in active:
            loop.at(start, functools.partial(self._arrive, end))

    def _arrive(self, window_end: float) -> None:
        now = self.loop.now
        if now >= window_end:
            return
        gap = self.rng.expovariate(1.0 / self.interval_us) if self.poisson else self.interval_us
        self.loop.after(gap, lambda: self._arrive(window_end))
        jitter = self.rng.expovariate(1.0 / REQUEST_LAUNCH_JITTER_MEAN_US)
        # One stream: a request's kernels cannot reach the GPU before the previous request's.
        launch = max(now + REQUEST_LAUNCH_US + jitter, self._last_launch)
        self._last_launch = launch
        self.loop.at(launch, functools.partial(self._submit, now))

    def _submit(self, arrival: float) -> None:
        self.launches += self.kernels
        self.gpu.submit(self.ctx, self.work_us, self._done(arrival))

    def _done(self, arrival: float) -> Callable[[], None]:
        def finish() -> None:
            self.kernels_done += self.kernels
            self.requests_done += 1
            self._latencies.append(self.loop.now - arrival)
            self.arrivals.append(arrival)

        return finish

    @property
    def latencies_us(self) -> list[float] | None:
        return self._latencies
