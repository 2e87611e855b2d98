"""The control loop of one GPU: sense, plan, act, once per period.

It does not know which enforcer it drives; the daemon runs one per GPU on real time, the simulator
runs one on simulated time.
"""

from __future__ import annotations

from collections.abc import Sequence

from qpolicy.demand import estimate_demand
from qpolicy.enforcers.base import Enforcer
from qpolicy.engine import Plan, plan
from qpolicy.model import GpuConfig, PodSpec


class ControlLoop:
    def __init__(self, gpu: GpuConfig, pods: Sequence[PodSpec], enforcer: Enforcer) -> None:
        self.gpu = gpu
        self.pods = [p for p in pods if p.gpu == gpu.index]
        self.enforcer = enforcer
        self.last_plan: Plan | None = None

    def step(self) -> Plan:
        """Close the period that ends now and start the next one."""
        usage = self.enforcer.collect()
        if self.last_plan is None:
            # Nothing measured yet: assume everyone is busy; idle pods show up within a period.
            demand = {p.id: 1.0 for p in self.pods}
        else:
            demand = estimate_demand(usage, self.gpu.period_us)
        self.last_plan = plan(self.gpu, self.pods, demand)
        self.enforcer.apply(self.last_plan)
        return self.last_plan
