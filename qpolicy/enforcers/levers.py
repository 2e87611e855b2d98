"""What the slice scheduler pulls and reads: a ChannelControl (the levers) and a UsageSensor.

The rm enforcer implements them over RM controls and the probe, the simulator over its GPU model.
"""

from __future__ import annotations

from typing import Protocol


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
