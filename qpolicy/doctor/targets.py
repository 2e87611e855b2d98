"""The online targets (issue 14), in one place.

The doctor's recommendation and its promise (qpolicy.doctor.report, qpolicy.doctor.promise) and
`make bench-gpu`'s verdict on its online rows (tools/bench/gpu.py) judge a run with these numbers
and these rules, so that a node's promise and the benchmark cannot drift apart:

* online p99 within P99_BOUND x solo's and p50 within P50_BOUND x solo's, where solo is stable: a
  solo whose p99 is over UNSTABLE_SOLO x its p50 is too noisy to divide by, and is reported, not
  judged by; of a run's several solos, the stable one with the lowest p99 (stricter_solo());
* the trainer at TRAINER_FLOOR or more of its throughput next to the online stream under native
  time-slicing;
* strictly better than another way of sharing the GPU (native time-slicing, MPS) at both p50
  and p99.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

P99_BOUND, P50_BOUND = 1.5, 1.2
TRAINER_FLOOR = 0.95
UNSTABLE_SOLO = 2.0


class AgainstSolo(NamedTuple):
    """A run's online percentiles as multiples of solo's, and whether each is within its bound."""

    p50_ratio: float
    p99_ratio: float
    p50_met: bool
    p99_met: bool


def solo_unstable(solo_p50: float, solo_p99: float) -> bool:
    """Whether a solo baseline is too noisy to divide by."""
    return solo_p99 > UNSTABLE_SOLO * solo_p50


def stricter_solo(solos: Sequence[tuple[float, float] | None]) -> int | None:
    """Of a run's solo baselines, each (p50, p99) or None where it measured nothing, the index of
    the one to hold the run to: of the stable ones the one with the lowest p99, the stricter (the
    first of equals); None where none is stable. Why several: a host's solo was unstable now and
    then beside stable ones minutes apart (H200 calls 35C-36H, BENCHMARKS.md 2026-12-04), so the
    bench and the doctor measure it before and after."""
    stable = [
        (solo[1], i)
        for i, solo in enumerate(solos)
        if solo is not None and not solo_unstable(*solo)
    ]
    return min(stable)[1] if stable else None


def against_solo(p50: float, p99: float, solo_p50: float, solo_p99: float) -> AgainstSolo | None:
    """``p50`` and ``p99`` held against a solo baseline; None where that solo is unstable."""
    if solo_unstable(solo_p50, solo_p99):
        return None
    r50, r99 = p50 / solo_p50, p99 / solo_p99
    return AgainstSolo(r50, r99, r50 <= P50_BOUND, r99 <= P99_BOUND)


def trainer_kept(trainer: float, native_trainer: float) -> tuple[float, bool]:
    """The trainer's throughput as a part of its native co-located one, and whether that is at
    least TRAINER_FLOOR."""
    keeps = trainer / native_trainer
    return keeps, keeps >= TRAINER_FLOOR


def better_than(p50: float, p99: float, other_p50: float, other_p99: float) -> bool:
    """Whether a run beats another at both percentiles (strictly)."""
    return p50 < other_p50 and p99 < other_p99
