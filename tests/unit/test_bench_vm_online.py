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
