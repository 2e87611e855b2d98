"""``qpolicy daemon --enforcer sim``: a simulated node behind the daemon, for demos and dashboards.

The scenario's pods, not the state file's, are what it runs: the whole view comes from the
simulation (:class:`~qpolicy.sim.node.SimulatedNode`), advanced to the present at every tick.
"""

from __future__ import annotations

from typing import Any

from qpolicy.backends.base import BackendContext
from qpolicy.model import PodSpec
from qpolicy.sim.node import SimulatedNode
from qpolicy.sim.scenario import Scenario
from qpolicy.state import DesiredState
from qpolicy.telemetry.view import Enforcement, NodeView


class SimBackend:
    kind = "sim"

    def __init__(self, context: BackendContext, scenario: Scenario, speed: float = 1.0) -> None:
        self.scenario = scenario
        self.node = SimulatedNode(scenario, speed=speed, clock=context.clock)

    def unenforceable(self, pod: PodSpec) -> str | None:
        return None

    def sync(self, state: DesiredState) -> None:
        pass  # the scenario decides what runs

    def refresh(self) -> None:
        self.node.advance()

    def publish(self) -> None:
        pass

    def enforcement(self, gpu: int, pod: str) -> Enforcement:
        return Enforcement()

    def period_us(self, gpu: int) -> float | None:
        return None  # view() makes the node up, periods included

    def view(self) -> NodeView | None:
        return self.node.view()

    @property
    def up(self) -> bool | None:
        return True

    def status(self) -> dict[str, Any]:
        return {
            "scenario_pods": [pod.name for pod in self.scenario.pods],
            "scenario_runs": self.node.runs,
        }

    def close(self) -> None:
        pass
