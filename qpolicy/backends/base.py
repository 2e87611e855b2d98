"""What the daemon asks of a backend, and what every backend is told when it is made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qpolicy.model import PodSpec
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.state import DesiredState
from qpolicy.telemetry.probesource import ProbeSource
from qpolicy.telemetry.view import Enforcement, NodeView


@dataclass(frozen=True, slots=True)
class BackendContext:
    """What the daemon has made before its backend: the loop, the probe, where things live."""

    loop: RealtimeLoop
    probe: ProbeSource | None
    state_dir: Path
    cgroup_root: Callable[[], Path | None]
    clock: Callable[[], float]


class Backend(Protocol):
    #: The enforcer's name, as ``--enforcer`` spells it.
    kind: str

    def unenforceable(self, pod: PodSpec) -> str | None:
        """Why this enforcer cannot carry ``pod`` out, or None if it can (admission asks)."""
        ...

    def sync(self, state: DesiredState) -> None:
        """The admitted desired state changed: carry it out from now on."""
        ...

    def refresh(self) -> None:
        """Called every tick on the loop thread: cheap upkeep."""
        ...

    def publish(self) -> None:
        """Called before each published view: read what the enforcer counted."""
        ...

    def enforcement(self, gpu: int, pod: str) -> Enforcement:
        """What the enforcer measured for ``pod`` on ``gpu``."""
        ...

    def period_us(self, gpu: int) -> float | None:
        """The period the enforcer runs ``gpu`` at now, where it plans periods of its own (the rm
        enforcer's plans, whose steady ones it stretches so that each turn is its minimum turn);
        None where the enforcer runs the configured period, or has planned nothing yet."""
        ...

    def view(self) -> NodeView | None:
        """The whole node view, where the backend makes the node up (the simulator); else None."""
        ...

    @property
    def up(self) -> bool | None:
        """Whether the enforcer did what it was last asked (None: there is no enforcer)."""
        ...

    def status(self) -> dict[str, Any]:
        """What ``qpolicy status`` shows of the enforcer (JSON-able)."""
        ...

    def close(self) -> None:
        """Give everything back: every pod open, every timeslice restored, nothing configured."""
        ...


BackendFactory = Callable[[BackendContext], Backend]
