"""Turning what pods did last period into what they are expected to want next period."""

from __future__ import annotations

from collections.abc import Mapping

from qpolicy.enforcer import PodUsage


def estimate_demand(usage: Mapping[str, PodUsage], period_us: float) -> dict[str, float]:
    """Demand per pod as a fraction of the period, from the period that just ended.

    A pod that had work it could not run wants more than it got; nothing says how much more, so it
    is treated as saturating (1.0) and the engine's caps and shares decide. A pod that went idle
    wanted exactly what it used.
    """
    if period_us <= 0:
        raise ValueError(f"period must be positive, got {period_us}")
    return {pod: 1.0 if u.hungry else min(u.used_us / period_us, 1.0) for pod, u in usage.items()}
