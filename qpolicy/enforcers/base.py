"""What every enforcer offers the control loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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

    def release(self) -> None:
        """Give every pod its channels back and restore timeslices (shutdown)."""
        ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time in microseconds and one-shot timers."""

    @property
    def now(self) -> float: ...

    def at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...


class ChannelControl(Protocol):
    """Opens and closes a pod's GPU channels and sets their timeslice.

    Controls act ``latency_us`` after they are issued and are carried out one after another, as
    RM controls on one GPU are.
    """

    @property
    def latency_us(self) -> float: ...

    def set_enabled(self, pod: str, enabled: bool) -> None: ...

    def set_timeslice(self, pod: str, timeslice_us: int | None) -> None:
        """``None`` restores the timeslice the pod's own driver stack chose."""
        ...

    def settled_at(self) -> float:
        """When every control issued so far will have taken effect."""
        ...


class UsageSensor(Protocol):
    #: Whether gpu_time_us counts only the time the pod's work really ran, also while pods run
    #: side by side. A sensor that can only tell when a pod was allowed to run is not exact, and
    #: caps on pods that share the GPU concurrently cannot be enforced from it.
    exact: bool

    def gpu_time_us(self, pod: str) -> float:
        """GPU time the pod has used since it appeared (monotonic)."""
        ...

    def idle_for_us(self, pod: str) -> float:
        """How long the pod has had no work queued; 0 while it has work."""
        ...
