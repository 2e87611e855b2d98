"""`make bench-gpu`'s online verdict: what it divides by, and what it will not."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench import gpu

TRAINER_8192 = next(s for s in gpu.SCENARIOS if s.name.startswith("online") and "8192" in s.name)
TRAINER_2048 = next(s for s in gpu.SCENARIOS if s.name.startswith("online") and "2048" in s.name)


def report(solo: dict[str, float], qpolicy: dict[str, float], name: str) -> dict[str, Any]:
    native = {"online_p50_ms": 1.7, "online_p99_ms": 2.8, "trainer_it_per_s": 300.0}
    mps = {"online_p50_ms": 1.2, "online_p99_ms": 3.0, "trainer_it_per_s": 200.0}
    return {
        "online_solo": solo,
        "scenarios": {
            name: [
                {"mode": "native", "summary": native},
                {"mode": "mps", "summary": mps},
                {"mode": "qpolicy", "summary": qpolicy},
            ]
        },
    }


def test_online_rows_have_3000_requests_and_both_trainer_shapes() -> None:
    assert gpu.ONLINE_HZ * 20 >= 3000
    assert TRAINER_8192.name != TRAINER_2048.name


def test_meets_only_when_every_target_holds() -> None:
    q = {"online_p50_ms": 0.6, "online_p99_ms": 0.9, "trainer_it_per_s": 290.0}
    r = report({"p50_ms": 0.55, "p99_ms": 0.71}, q, TRAINER_8192.name)
    verdict = gpu._online_verdict(TRAINER_8192, q, r)
    assert verdict.endswith(": meets") and "trainer 97% of native" in verdict
    slow = {**q, "trainer_it_per_s": 250.0}
    assert gpu._online_verdict(
        TRAINER_8192, slow, report(r["online_solo"], slow, TRAINER_8192.name)
    ).endswith("MISSES")


@pytest.mark.parametrize("p99", [0.9, 3.4])
def test_an_unstable_solo_is_reported_not_divided_by(p99: float) -> None:
    q = {"online_p50_ms": 0.6, "online_p99_ms": 2.0, "trainer_it_per_s": 300.0}
    solo = {"p50_ms": 0.5, "p99_ms": p99}
    verdict = gpu._online_verdict(TRAINER_2048, q, report(solo, q, TRAINER_2048.name))
    if p99 > 2 * 0.5:
        assert "solo unstable (p99 3.40 > 2x p50 0.50): not divided by" in verdict
        assert "x solo" not in verdict
    else:
        assert "p99 2.22x solo" in verdict and verdict.endswith("MISSES")


def test_the_run_on_the_gpu_is_reported_beside_the_latency_and_does_not_decide() -> None:
    q = {"online_p50_ms": 0.6, "online_p99_ms": 0.9, "trainer_it_per_s": 290.0}
    solo = {"p50_ms": 0.55, "p99_ms": 0.71}
    plain = gpu._online_verdict(TRAINER_8192, q, report(solo, q, TRAINER_8192.name))
    timed = {**q, "online_run_p50_ms": 0.52}
    solo_timed = {**solo, "run_p50_ms": 0.40}
    verdict = gpu._online_verdict(TRAINER_8192, timed, report(solo_timed, timed, TRAINER_8192.name))
    assert "its run on the GPU p50 1.30x solo's" in verdict
    assert verdict.endswith(": meets") and plain.endswith(": meets")
