"""``--enforcer kmod``: qgpu.ko runs the periods; the daemon reconciles its configuration.

No control loop runs here: the module plans and gates every period in the kernel. The backend
pushes the admitted desired state when it changes, retries what could not be pushed (a cgroup that
does not exist yet) on the next ticks, and reads the module's counters at the publish rate.
"""

from __future__ import annotations

from typing import Any

from qpolicy.backends.base import BackendContext
from qpolicy.enforcers.kmod.client import QgpuClient, policy_name
from qpolicy.enforcers.kmod.enforcer import KmodEnforcer, unenforceable
from qpolicy.enforcers.strategy import strategy_for
from qpolicy.errors import QPolicyError
from qpolicy.model import PodSpec
from qpolicy.state import DesiredState
from qpolicy.telemetry.view import Enforcement, NodeView


class KmodBackend:
    kind = "kmod"

    def __init__(self, context: BackendContext, client: QgpuClient) -> None:
        root = context.cgroup_root()
        if root is None:
            client.close()
            raise QPolicyError(
                "the kmod enforcer knows pods by cgroup id, and no cgroup v2 hierarchy is mounted"
            )
        self.client = client
        # Which timeslices keep online work ahead on a GPU is what its doctor measured.
        state_dir = context.state_dir
        self.enforcer = KmodEnforcer(
            client, cgroup_root=root, strategy=lambda gpu: strategy_for(state_dir, gpu)
        )

    def unenforceable(self, pod: PodSpec) -> str | None:
        return unenforceable(pod)

    def sync(self, state: DesiredState) -> None:
        self.enforcer.sync(state)

    def refresh(self) -> None:
        self.enforcer.retry()

    def publish(self) -> None:
        self.enforcer.read()

    def enforcement(self, gpu: int, pod: str) -> Enforcement:
        stats = self.enforcer.stats(pod)
        if stats is None or stats.gpu != gpu:
            return Enforcement()
        # The module reports open and throttled time, not whether the cgroup is closed now.
        return Enforcement(gpu_time_s=stats.open_ns / 1e9, throttled_s=stats.throttled_ns / 1e9)

    def period_us(self, gpu: int) -> float | None:
        return None  # the module runs each GPU at the configured period

    def view(self) -> NodeView | None:
        return None

    @property
    def up(self) -> bool | None:
        return self.enforcer.up

    def status(self) -> dict[str, Any]:
        strategies = self.enforcer.strategies
        return {
            "gpus": {
                str(index): {
                    "policy": policy_name(gpu.policy),
                    "period_us": gpu.period_us,
                    "periods": gpu.nr_periods,
                    "switches": gpu.switches,
                    "online_busy": gpu.online_busy,
                    "offline_timeslice_us": gpu.offline_timeslice_us,
                    "online_timeslice_us": gpu.online_timeslice_us,
                    "offline_preemption": (
                        None
                        if gpu.offline_preemption is None
                        else gpu.offline_preemption.name.lower()
                    ),
                }
                | ({"online_strategy": strategies[index].describe()} if index in strategies else {})
                for index, gpu in sorted(self.enforcer.gpu_stats.items())
            },
            "configured": sorted(self.enforcer.configured),
        }

    def close(self) -> None:
        try:
            self.enforcer.release()
        finally:
            self.client.close()
