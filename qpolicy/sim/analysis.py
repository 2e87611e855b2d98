"""What a scenario should give each pod, phase by phase, next to what the simulation achieved.

A *phase* is a stretch of the run in which the same pods are active. The expected split is the
engine's plan for that phase with saturating pods at demand 1 and request streams at the GPU time
they need alone, so it is the policy's promise, computed independently of the simulated hardware.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from qpolicy.engine import plan
from qpolicy.sim.runner import SimResult
from qpolicy.sim.scenario import RequestsLoad, Scenario, ScenarioPod


@dataclass(frozen=True, slots=True)
class Phase:
    start_s: float
    end_s: float
    active: tuple[str, ...]
    expected: dict[str, float]
    # Mean over the windows that lie inside the phase once it has settled (one period in); None when
    # no window fits.
    achieved: dict[str, float] | None

    def to_json(self) -> dict[str, object]:
        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "active": list(self.active),
            "expected": {pod: round(value, 4) for pod, value in self.expected.items()},
            "achieved": None
            if self.achieved is None
            else {pod: round(value, 4) for pod, value in self.achieved.items()},
        }


def solo_demand(pod: ScenarioPod) -> float:
    """The fraction of the GPU a pod's load needs when it runs alone."""
    load = pod.load
    if isinstance(load, RequestsLoad):
        return min(load.rate_hz * load.kernels * load.kernel_ms / 1000.0, 1.0)
    return 1.0


def _is_active(pod: ScenarioPod, start: float, end: float) -> bool:
    return any(w_start <= start and end <= w_end for w_start, w_end in pod.active)


def phases(scenario: Scenario, result: SimResult | None = None) -> list[Phase]:
    """The phases of ``scenario``; with ``result``, the achieved split of each too."""
    edges = {0.0, scenario.duration_s}
    for pod in scenario.pods:
        for start, end in pod.active:
            edges.update((start, end))
    ordered = sorted(edges)
    settle = scenario.gpu.period_ms / 1000.0
    found: list[Phase] = []
    for start, end in itertools.pairwise(ordered):
        if end - start <= settle:
            continue
        active = [p for p in scenario.pods if _is_active(p, start, end)]
        demand = {p.name: solo_demand(p) for p in active}
        expected_plan = plan(scenario.gpu, scenario.pod_specs(), demand)
        expected = {s.pod: s.allocation for s in expected_plan.slices}
        achieved = None
        if result is not None:
            inside = [
                index
                for index, (w_start, w_end) in enumerate(result.windows)
                if w_start >= start + settle - 1e-9 and w_end <= end + 1e-9
            ]
            if inside:
                achieved = {
                    name: sum(pod.windows[i] for i in inside) / len(inside)
                    for name, pod in result.pods.items()
                }
        found.append(Phase(start, end, tuple(p.name for p in active), expected, achieved))
    return found
