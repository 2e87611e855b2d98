"""Run a scenario on the simulated GPU, with qpolicy's control loop or with native time-slicing."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from qpolicy.control import ControlLoop
from qpolicy.model import PodClass
from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim.calibration import CUDA_TIMESLICE_US
from qpolicy.sim.enforcer import SimEnforcer
from qpolicy.sim.gpu import SimGpu
from qpolicy.sim.scenario import RequestsLoad, SaturateLoad, Scenario, ScenarioPod
from qpolicy.sim.workload import Requests, Saturate

US_PER_S = 1_000_000.0


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    samples: int

    @classmethod
    def of(cls, samples_us: list[float]) -> Latency | None:
        if not samples_us:
            return None
        ordered = sorted(samples_us)

        def rank(q: float) -> float:
            return ordered[max(math.ceil(q * len(ordered)) - 1, 0)] / 1000.0

        return cls(p50_ms=rank(0.50), p99_ms=rank(0.99), samples=len(ordered))

    def to_json(self) -> dict[str, float]:
        return {"p50": round(self.p50_ms, 4), "p99": round(self.p99_ms, 4)}


@dataclass(frozen=True, slots=True)
class PodResult:
    name: str
    pod_class: PodClass
    share_target: int | None
    gpu_time_fraction: float
    kernels_done: int
    requests_done: int | None
    throughput_per_s: float
    latency: Latency | None
    solo_latency: Latency | None
    windows: tuple[float, ...]
    # (arrival s, latency ms) of every completed request, for plots.
    latency_trace: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class SimResult:
    scenario: Scenario
    seed: int
    window_s: float
    gated: bool
    utilization: float
    context_switches: int
    controls: int
    pods: dict[str, PodResult]
    windows: tuple[tuple[float, float], ...]

    def to_json(self) -> dict[str, Any]:
        gpu = self.scenario.gpu
        return {
            "gpu": {
                "policy": gpu.policy.value,
                "period_ms": gpu.period_ms,
                "utilization": round(self.utilization, 4),
                "context_switches": self.context_switches,
                "channel_controls": self.controls,
            },
            "enforcer": "qpolicy" if self.gated else "native",
            "duration_s": self.scenario.duration_s,
            "seed": self.seed,
            "window_s": self.window_s,
            "pods": {
                name: {
                    "class": pod.pod_class.value,
                    "share_target": pod.share_target,
                    "gpu_time_fraction": round(pod.gpu_time_fraction, 4),
                    "kernels_done": pod.kernels_done,
                    "requests_done": pod.requests_done,
                    "throughput_per_s": round(pod.throughput_per_s, 3),
                    "latency_ms": pod.latency.to_json() if pod.latency else None,
                    "solo_latency_ms": pod.solo_latency.to_json() if pod.solo_latency else None,
                }
                for name, pod in self.pods.items()
            },
            "windows": [
                {
                    "start_s": round(start, 6),
                    "end_s": round(end, 6),
                    "gpu_time_fraction": {
                        name: round(pod.windows[index], 4) for name, pod in self.pods.items()
                    },
                }
                for index, (start, end) in enumerate(self.windows)
            ],
        }


class Simulation:
    """A scenario's GPU, processes and (when ``gated``) qpolicy's control loop, ready to run.

    :func:`run` drives one to the end; the daemon's simulated node advances one with the clock.
    """

    def __init__(
        self, scenario: Scenario, *, seed: int = 0, window_s: float = 1.0, gated: bool = True
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window must be positive, got {window_s}")
        self.scenario = scenario
        self.loop = EventLoop()
        self.gpu = SimGpu(self.loop, window_us=window_s * US_PER_S)
        # Every context starts as libcuda leaves it: channels enabled, 2048 µs timeslice.
        self.contexts = {
            p.name: self.gpu.add_context(p.name, CUDA_TIMESLICE_US) for p in scenario.pods
        }
        self.workloads = {
            p.name: _workload(self.loop, self.gpu, self.contexts[p.name], p, seed)
            for p in scenario.pods
        }
        self.enforcer: SimEnforcer | None = None
        self.control: ControlLoop | None = None
        if gated:
            self.enforcer = SimEnforcer(self.gpu, self.contexts)
            self.control = ControlLoop(scenario.gpu, scenario.pod_specs(), self.enforcer)
            self.loop.at(0.0, lambda: self._step(0))

    def _step(self, index: int) -> None:
        assert self.control is not None
        self.control.step()
        period_us = float(self.scenario.gpu.period_us)
        self.loop.at((index + 1) * period_us, lambda: self._step(index + 1))

    def run_until(self, seconds: float) -> None:
        self.loop.run_until(seconds * US_PER_S)
        self.gpu.flush()

    @property
    def now_s(self) -> float:
        return self.loop.now / US_PER_S

    @property
    def controls(self) -> int:
        return 0 if self.enforcer is None else self.enforcer.control.controls


def run(
    scenario: Scenario,
    *,
    seed: int = 0,
    window_s: float = 1.0,
    gated: bool = True,
    solo: bool = True,
) -> SimResult:
    """Simulate ``scenario``; ``gated=False`` leaves the GPU to native time-slicing.

    With ``solo``, every request stream is also run alone on an idle GPU (same seed, so the same
    arrivals and host jitter) to give the latency it is compared against.
    """
    sim = Simulation(scenario, seed=seed, window_s=window_s, gated=gated)
    sim.run_until(scenario.duration_s)
    duration_us = scenario.duration_s * US_PER_S
    contexts, workloads, gpu = sim.contexts, sim.workloads, sim.gpu
    controls = sim.controls

    window_us = window_s * US_PER_S
    bounds = tuple(
        (index * window_s, min((index + 1) * window_s, scenario.duration_s))
        for index in range(math.ceil(duration_us / window_us - 1e-9))
    )
    pods: dict[str, PodResult] = {}
    for p in scenario.pods:
        ctx = contexts[p.name]
        work = workloads[p.name]
        samples = work.latencies_us
        solo_latency = None
        if solo and samples is not None:
            alone = replace(scenario, pods=(p,))
            solo_latency = (
                run(alone, seed=seed, window_s=window_s, gated=False, solo=False)
                .pods[p.name]
                .latency
            )
        filled = ctx.windows + [0.0] * (len(bounds) - len(ctx.windows))
        pods[p.name] = PodResult(
            name=p.name,
            pod_class=p.pod_class,
            share_target=p.share,
            gpu_time_fraction=ctx.gpu_time / duration_us,
            kernels_done=work.kernels_done,
            requests_done=work.requests_done if isinstance(work, Requests) else None,
            throughput_per_s=work.kernels_done / scenario.duration_s,
            latency=Latency.of(samples) if samples is not None else None,
            solo_latency=solo_latency,
            windows=tuple(
                filled[index] / ((end - start) * US_PER_S)
                for index, (start, end) in enumerate(bounds)
            ),
            latency_trace=tuple(
                (arrival / US_PER_S, latency / 1000.0)
                for arrival, latency in zip(work.arrivals, samples or [], strict=True)
            )
            if isinstance(work, Requests)
            else (),
        )
    return SimResult(
        scenario=scenario,
        seed=seed,
        window_s=window_s,
        gated=gated,
        utilization=sum(ctx.gpu_time for ctx in contexts.values()) / duration_us,
        context_switches=gpu.switches,
        controls=controls,
        pods=pods,
        windows=bounds,
    )


def _workload(
    loop: EventLoop, gpu: SimGpu, ctx: Any, pod: ScenarioPod, seed: int
) -> Saturate | Requests:
    active = [(start * US_PER_S, end * US_PER_S) for start, end in pod.active]
    load = pod.load
    if isinstance(load, SaturateLoad):
        return Saturate(
            loop,
            gpu,
            ctx,
            kernel_us=load.kernel_ms * 1000.0,
            sync_every=load.sync_every,
            active=active,
        )
    assert isinstance(load, RequestsLoad)
    return Requests(
        loop,
        gpu,
        ctx,
        rate_hz=load.rate_hz,
        kernels=load.kernels,
        kernel_us=load.kernel_ms * 1000.0,
        poisson=load.poisson,
        active=active,
        rng=random.Random(f"{seed}:{pod.name}"),
    )
