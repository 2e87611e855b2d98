"""Simulator speed: wall time to simulate 20 s of a 3-pod GPU (target < 2 s), qpolicy vs native.

The same scenario runs with qpolicy's control loop and with native time-slicing in the same
process. Solo latency runs (made by `qpolicy sim` for request streams) are left out: they are a
separate, smaller simulation.
"""

from __future__ import annotations

import time
from typing import Any

from qpolicy.runtime.virtual import EventLoop
from qpolicy.sim import runner
from qpolicy.sim.scenario import parse_scenario
from qpolicy.sim.scenarios import builtin

TARGET_S = 2.0


def _short_kernels() -> Any:
    pods = [
        {"name": name, "load": {"kind": "saturate", "kernel_ms": ms, "sync_every": 8}}
        for name, ms in (("k30us", 0.03), ("k100us", 0.1), ("k500us", 0.5))
    ]
    return parse_scenario({"gpu": {"policy": "best-effort"}, "duration_s": 20, "pods": pods})


SCENARIOS = {
    "demo (1 online + 2 trainers, burst-share)": lambda: builtin("demo"),
    "3 trainers, 30/100/500 us kernels, best-effort": _short_kernels,
}


def _events_counter() -> tuple[list[int], Any]:
    seen: list[int] = []
    original = EventLoop.run_until

    def counting(self: EventLoop, end: float) -> None:
        original(self, end)
        seen.append(self.processed)

    return seen, counting


def run(repeats: int = 3) -> dict[str, Any]:
    results: dict[str, Any] = {"target_s": TARGET_S, "scenarios": {}}
    for label, make in SCENARIOS.items():
        scenario = make()
        row: dict[str, Any] = {"simulated_s": scenario.duration_s, "pods": len(scenario.pods)}
        for mode, gated in (("qpolicy", True), ("native", False)):
            walls = []
            events = 0
            for _ in range(repeats):
                seen, counting = _events_counter()
                original = EventLoop.run_until
                EventLoop.run_until = counting  # type: ignore[method-assign]
                try:
                    start = time.perf_counter()
                    runner.run(scenario, gated=gated, solo=False)
                    walls.append(time.perf_counter() - start)
                finally:
                    EventLoop.run_until = original  # type: ignore[method-assign]
                events = seen[-1]
            best = min(walls)
            row[mode] = {
                "wall_s": round(best, 3),
                "events": events,
                "sim_s_per_wall_s": round(scenario.duration_s / best, 1),
                "events_per_s": round(events / best),
            }
        row["meets_target"] = row["qpolicy"]["wall_s"] < TARGET_S
        results["scenarios"][label] = row
    return results
