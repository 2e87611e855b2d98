"""The simulator's results on the foundation issue's targets, with native time-slicing beside them.

Runs the shipped target scenarios (qpolicy/sim/scenarios/) the way tests/unit/test_sim_targets.py
does, and reports the numbers the tests only bound.
"""

from __future__ import annotations

from statistics import mean
from typing import Any

from qpolicy.sim.runner import SimResult
from qpolicy.sim.runner import run as simulate
from qpolicy.sim.scenarios import builtin


def _shares(result: SimResult) -> dict[str, float]:
    return {name: round(pod.gpu_time_fraction, 4) for name, pod in result.pods.items()}


def _window_mean(result: SimResult, start: float, end: float) -> dict[str, float]:
    inside = [i for i, (a, b) in enumerate(result.windows) if a >= start - 1e-9 and b <= end + 1e-9]
    return {
        name: round(mean(pod.windows[i] for i in inside), 4) for name, pod in result.pods.items()
    }


def _fixed_share() -> dict[str, Any]:
    scenario = builtin("fixed-share")
    got = _shares(simulate(scenario))
    want = {"a": 0.5, "b": 0.3, "c": 0.2}
    return {
        "target": "each within +-0.02 of 0.50 / 0.30 / 0.20",
        "qpolicy": got,
        "native": _shares(simulate(scenario, gated=False)),
        "meets_target": all(abs(got[p] - want[p]) <= 0.02 for p in want),
    }


def _fixed_share_alone() -> dict[str, Any]:
    got = _shares(simulate(builtin("fixed-share-alone")))
    return {"target": "<= 0.31", "qpolicy": got, "meets_target": got["a"] <= 0.31}


def _burst_share_late() -> dict[str, Any]:
    scenario = builtin("burst-share-late")
    late = scenario.pods[2].active[0][0]
    period = scenario.gpu.period_ms / 1000
    result = simulate(scenario, window_s=period)
    before = _window_mean(result, period, late)
    back = [i for i, (a, _) in enumerate(result.windows) if a >= late + period]
    worst = {
        name: round(max(abs(pod.windows[i] - share) for i in back), 4)
        for (name, pod), share in zip(result.pods.items(), (0.5, 0.3, 0.2), strict=True)
    }
    return {
        "target": "0.625 / 0.375 +-0.03 while c idles; every period from one period after c "
        "starts at 0.50 / 0.30 / 0.20 +-0.03",
        "qpolicy_while_idle": before,
        "qpolicy_after": _window_mean(result, late + period, scenario.duration_s),
        "qpolicy_worst_period_error_after": worst,
        "meets_target": abs(before["a"] - 0.625) <= 0.03
        and abs(before["b"] - 0.375) <= 0.03
        and max(worst.values()) <= 0.03,
    }


def _best_effort() -> dict[str, Any]:
    scenario = builtin("best-effort-kernels")
    got = _shares(simulate(scenario))
    return {
        "target": "each 0.333 +-0.02",
        "qpolicy": got,
        "native": _shares(simulate(scenario, gated=False)),
        "meets_target": all(abs(v - 1 / 3) <= 0.02 for v in got.values()),
    }


def _online_offline() -> dict[str, Any]:
    scenario = builtin("online-offline")
    rows: dict[str, Any] = {
        "target": "online p99 <= 1.5 x solo p99; offline >= 0.90 of what online leaves"
    }
    ok = True
    for label, gated in (("qpolicy", True), ("native", False)):
        result = simulate(scenario, gated=gated)
        infer, train = result.pods["infer"], result.pods["train"]
        assert infer.latency is not None and infer.solo_latency is not None
        ratio = infer.latency.p99_ms / infer.solo_latency.p99_ms
        keeps = train.gpu_time_fraction / (1 - infer.gpu_time_fraction)
        rows[label] = {
            "online_p50_ms": round(infer.latency.p50_ms, 3),
            "online_p99_ms": round(infer.latency.p99_ms, 3),
            "solo_p99_ms": round(infer.solo_latency.p99_ms, 3),
            "p99_over_solo": round(ratio, 2),
            "offline_keeps": round(keeps, 4),
        }
        if gated:
            ok = ratio <= 1.5 and keeps >= 0.9
    rows["meets_target"] = ok
    return rows


def run() -> dict[str, Any]:
    scenarios = {
        "fixed-share": _fixed_share(),
        "fixed-share-alone": _fixed_share_alone(),
        "burst-share-late": _burst_share_late(),
        "best-effort-kernels": _best_effort(),
        "online-offline": _online_offline(),
    }
    return {"scenarios": scenarios}
