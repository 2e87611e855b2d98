"""``--enforcer none``: the node is watched and its metrics served; nothing is enforced."""

from __future__ import annotations

from typing import Any

from qpolicy.backends.base import BackendContext
from qpolicy.model import PodSpec
from qpolicy.state import DesiredState
from qpolicy.telemetry.view import Enforcement, NodeView


class ObserveBackend:
    kind = "none"

    def __init__(self, context: BackendContext) -> None:
        del context  # nothing to drive

    def unenforceable(self, pod: PodSpec) -> str | None:
        return None

    def sync(self, state: DesiredState) -> None:
        pass

    def refresh(self) -> None:
        pass

    def publish(self) -> None:
        pass

    def enforcement(self, gpu: int, pod: str) -> Enforcement:
        return Enforcement()

    def period_us(self, gpu: int) -> float | None:
        return None

    def view(self) -> NodeView | None:
        return None

    @property
    def up(self) -> bool | None:
        return None

    def status(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
