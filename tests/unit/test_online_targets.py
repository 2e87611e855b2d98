"""The online targets in one place (qpolicy/doctor/targets.py): their bounds, and the doctor's
promise and `make bench-gpu`'s verdict judging the same run alike."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from qpolicy.doctor import targets
from qpolicy.doctor.promise import promise
from tools.bench import gpu

ROW_8192 = next(s for s in gpu.SCENARIOS if s.name.startswith("online") and "8192" in s.name)


def test_each_bound_holds_at_itself_and_fails_just_past_it() -> None:
    at = targets.against_solo(0.6, 1.2, 0.5, 0.8)
    assert at is not None and at.p50_met and at.p99_met
    past = targets.against_solo(0.6001, 1.2001, 0.5, 0.8)
    assert past is not None and not past.p50_met and not past.p99_met
    assert past.p50_ratio == pytest.approx(1.2002) and past.p99_ratio == pytest.approx(1.500125)
    assert targets.trainer_kept(95.0, 100.0) == (0.95, True)
    assert targets.trainer_kept(94.9, 100.0)[1] is False
    assert targets.better_than(1.0, 2.0, 1.01, 2.01)
    assert not targets.better_than(1.0, 2.0, 1.0, 3.0)  # a tie at p50 is not better


def test_a_solo_whose_p99_is_over_twice_its_p50_is_not_divided_by() -> None:
    assert targets.against_solo(0.6, 0.9, 0.5, 1.0) is not None
    assert targets.against_solo(0.6, 0.9, 0.5, 1.01) is None
    assert targets.solo_unstable(0.5, 1.01) and not targets.solo_unstable(0.5, 1.0)


def doctor_says(run: dict[str, float]) -> bool | None:
    def phase(lever: str, kind: str, p50: float, p99: float, trainer: float | None) -> Any:
        online = {"p50_ms": p50, "p99_ms": p99, "requests": 3001}
        calls = {"SET_TIMESLICE": {"sent": 1, "statuses": ["0x0"], "median_us": 300.0}}
        return {
            "lever": lever,
            "kind": kind,
            "online": online,
            "trainer_it_per_s": trainer,
            "calls": calls,
        }

    lever = "timeslice-1us-8ms"
    phases = [
        phase("solo", "baseline", run["solo_p50"], run["solo_p99"], None),
        phase("native", "baseline", run["native_p50"], run["native_p99"], run["native_it"]),
        phase("mps", "comparison", run["mps_p50"], run["mps_p99"], run["native_it"] * 0.7),
        phase(lever, "setting", run["p50"], run["p99"], run["it"]),
    ]
    met: bool | None = promise(phases, {"lever": lever})["met"]
    return met


def bench_says(run: dict[str, float]) -> bool | None:
    def summary(p50: float, p99: float, it: float) -> dict[str, float]:
        return {"online_p50_ms": p50, "online_p99_ms": p99, "trainer_it_per_s": it}

    mine = summary(run["p50"], run["p99"], run["it"])
    report = {
        "online_solo": {"p50_ms": run["solo_p50"], "p99_ms": run["solo_p99"]},
        "scenarios": {
            ROW_8192.name: [
                {
                    "mode": "native",
                    "summary": summary(run["native_p50"], run["native_p99"], run["native_it"]),
                },
                {"mode": "mps", "summary": summary(run["mps_p50"], run["mps_p99"], 1.0)},
                {"mode": "qpolicy", "summary": mine},
            ]
        },
    }
    verdict = gpu._online_verdict(ROW_8192, mine, report)
    if verdict.endswith(": meets"):
        return True
    if verdict.endswith(": MISSES"):
        return False
    assert "not judged" in verdict, verdict
    return None


def runs() -> list[dict[str, float]]:
    """Runs on each side of every bound (the 8192 row, where the trainer is judged)."""
    out = []
    for p50, p99, solo_p99, it, native_p50, mps_p99 in itertools.product(
        (0.59, 0.61), (1.19, 1.21), (0.8, 1.1), (94.0, 96.0), (0.60, 0.62), (1.20, 1.25)
    ):
        out.append(
            {
                "p50": p50,
                "p99": p99,
                "it": it,
                "solo_p50": 0.5,
                "solo_p99": solo_p99,
                "native_p50": native_p50,
                "native_p99": 2.8,
                "native_it": 100.0,
                "mps_p50": 1.2,
                "mps_p99": mps_p99,
            }
        )
    return out


def test_the_doctors_promise_and_the_benchs_verdict_judge_a_run_alike() -> None:
    """Every target the two judge: met, missed or not judged for the same reasons, on both
    sides of each bound (64 runs: p50 and p99 against solo, a stable and an unstable solo, the
    trainer, native's p50, MPS's p99)."""
    seen = set()
    for run in runs():
        assert doctor_says(run) == bench_says(run), run
        seen.add(doctor_says(run))
    assert seen == {True, False, None}


def test_of_several_solos_the_run_is_held_to_the_stable_one_with_the_lowest_p99() -> None:
    """The one rule the bench's rows, the VM bench and the doctor's promise pick their solo by."""
    assert targets.stricter_solo([(0.40, 0.60), (0.38, 0.55)]) == 1
    assert targets.stricter_solo([(0.40, 0.55), (0.38, 0.60)]) == 0
    assert targets.stricter_solo([(0.40, 0.55), (0.38, 0.55)]) == 0  # the first of equals
    assert targets.stricter_solo([(0.42, 1.03), (0.38, 0.74)]) == 1  # the first unstable
    assert targets.stricter_solo([None, (0.38, 0.74)]) == 1  # the first measured nothing
    assert targets.stricter_solo([(0.42, 1.03), (0.40, 0.95)]) is None
    assert targets.stricter_solo([]) is None
