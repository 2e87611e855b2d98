"""What the control loop asks of an enforcer that runs periods: the interface and its report.

An enforcer applies a :class:`~qpolicy.engine.Plan` to one GPU for one period and reports what each
pod used. The control loop (:mod:`qpolicy.control`) drives it without knowing whether it gates a
real GPU from userspace or a simulated one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from qpolicy.engine import Plan


@dataclass(frozen=True, slots=True)
class PodUsage:
    """What one pod did in the period that just ended.

    ``hungry`` means it had work it was not allowed to run: its turn or cap ran out while it was
    busy, or it waited with work queued for a turn it did not get.
    """

    used_us: float
    hungry: bool


class Enforcer(Protocol):
    name: str

    def collect(self) -> Mapping[str, PodUsage]:
        """Close the current period and report each planned pod's usage in it."""
        ...

    def apply(self, plan: Plan) -> None:
        """Start a period run by ``plan``."""
        ...

    def stand_down(self) -> None:
        """Stop enforcing until the next :meth:`apply`: open every pod, restore timeslices.

        Called when no plan can be made; nobody may stay closed because planning failed.
        """
        ...

    def release(self) -> None:
        """Give every pod its channels back and restore timeslices (shutdown)."""
        ...
