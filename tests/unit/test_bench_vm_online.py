"""`make bench-vm`'s online scenario: which solo it divides by, and when it does not divide."""

from __future__ import annotations

import pytest

from tools.bench import qgpu_vm


def lat(p50: float, p99: float) -> dict[str, float]:
    return {"p50_ms": p50, "p99_ms": p99, "requests": 1001}


@pytest.mark.parametrize(
    ("before", "after", "which"),
    [
        (lat(2.5, 4.0), lat(2.6, 4.5), "before"),  # both stable: the lower p99
        (lat(2.5, 4.9), lat(2.6, 4.5), "after"),
        (lat(2.55, 8.7), lat(2.6, 4.5), "after"),  # the first unstable (p99 > 2 x p50)
        (lat(2.5, 4.0), lat(2.72, 13.0), "before"),
        # 2026-12-04, the VM's two solos of one run: neither is divided by.
        (lat(2.55, 8.7), lat(2.72, 13.0), "neither stable"),
    ],
)
def test_the_online_pod_is_held_to_the_stricter_stable_solo(
    before: dict[str, float], after: dict[str, float], which: str
) -> None:
    solo, used = qgpu_vm.solo_of(before, after)
    assert used == which
    assert solo is (after if which == "after" else before)


def test_the_runs_have_the_thousand_requests_a_p99_needs() -> None:
    rate = float(qgpu_vm.REQUEST[qgpu_vm.REQUEST.index("--rate-hz") + 1])
    assert rate * qgpu_vm.ONLINE_SECONDS >= 1000


@pytest.mark.parametrize(
    ("ratio", "kept", "said"),
    [
        # 2026-12-04, the VM of one vCPU: both met.
        (1.22, 0.981, "p99 <= 1.5x solo: met (1.22x); offline kept >= 0.9: met (0.981)"),
        (1.51, 0.95, "p99 <= 1.5x solo: MISSED (1.51x); offline kept >= 0.9: met (0.950)"),
        (1.5, 0.899, "p99 <= 1.5x solo: met (1.50x); offline kept >= 0.9: MISSED (0.899)"),
        # The two-vCPU VM's runs: no solo stable, so the p99 is not judged, whatever it is.
        (
            None,
            0.92,
            "p99 <= 1.5x solo: not judged (no stable solo); offline kept >= 0.9: met (0.920)",
        ),
    ],
)
def test_the_verdict_holds_qgpu_to_the_kmod_issues_targets(
    ratio: float | None, kept: float, said: str
) -> None:
    assert qgpu_vm.kmod_verdict({"qgpu_p99_ratio": ratio, "qgpu_offline_kept": kept}) == said


def test_each_requests_latency_and_completion_are_kept_where_gpuload_gave_them() -> None:
    report = {"p50_ms": 2.5, "p99_ms": 2.9, "requests": 3, "max_ms": 3.0}
    assert qgpu_vm._latency(report) == {"p50_ms": 2.5, "p99_ms": 2.9, "requests": 3}
    timed = {**report, "latencies_ms": [2.4, 2.5, 3.0], "timeline": [0.02, 0.04, 0.06]}
    assert qgpu_vm._latency(timed) == {
        "p50_ms": 2.5,
        "p99_ms": 2.9,
        "requests": 3,
        "latencies_ms": [2.4, 2.5, 3.0],
        "done_s": [0.02, 0.04, 0.06],
    }
