"""``qpolicy daemon``: keeps the node's view current and serves it to Prometheus.

Every tick the daemon advances its sources (the desired-state file, the simulated node, and later
the probe and the hardware enforcers) and publishes a new immutable :class:`NodeView`; the exporter
thread only ever reads the latest one. SIGTERM and SIGINT stop it cleanly with status 0.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import FrameType

from qpolicy.engine import plan
from qpolicy.errors import QPolicyError, ValidationError
from qpolicy.sim.scenario import Scenario
from qpolicy.state import DesiredState, StateStore
from qpolicy.telemetry.cgroups import within
from qpolicy.telemetry.exporter import MetricsServer, serve
from qpolicy.telemetry.probesource import CgroupActivity, ProbeSource, merge
from qpolicy.telemetry.simsource import SimulatedNode
from qpolicy.telemetry.view import DriverActivity, Enforcement, GpuView, NodeView, PodView

# How often cgroups that are gone are dropped from the probe's maps (which have a fixed size).
PRUNE_EVERY_S = 10.0


class EnforcerKind(StrEnum):
    SIM = "sim"
    NONE = "none"


class ProbeMode(StrEnum):
    """Whether to load the eBPF probe: ``auto`` tries and carries on without it."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    enforcer: EnforcerKind
    state_dir: Path
    metrics_addr: str | None
    scenario: Scenario | None = None
    speed: float = 1.0
    tick_s: float = 0.1
    probe: ProbeMode = ProbeMode.OFF

    def __post_init__(self) -> None:
        if self.enforcer is EnforcerKind.SIM and self.scenario is None:
            raise ValidationError("--enforcer sim needs a scenario (--scenario NAME|FILE)")
        if not 0.01 <= self.tick_s <= 10:
            raise ValidationError(f"invalid tick {self.tick_s!r} s: must be from 0.01 to 10")


class StateSource:
    """The desired-state file, re-read when it changes; the last good state survives a bad one."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.state = DesiredState()
        self.up = False
        self.error: str | None = None
        self._seen: tuple[float, int] | None = None

    def refresh(self) -> None:
        try:
            stat = self.store.path.stat()
            stamp = (stat.st_mtime, stat.st_ino)
        except FileNotFoundError:
            stamp = (0.0, 0)
        except OSError as error:
            self.up, self.error = False, str(error)
            return
        if stamp == self._seen and self.up:
            return
        try:
            self.state = self.store.load()
        except QPolicyError as error:
            self.up, self.error = False, str(error)
            return
        self.up, self.error, self._seen = True, None, stamp


def load_probe() -> ProbeSource:
    from qpolicy.telemetry.probe import NvProbe  # bcc is imported only when a probe is wanted

    return ProbeSource(NvProbe().start())


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe_loader: Callable[[], ProbeSource] = load_probe,
    ) -> None:
        self.config = config
        self.state = StateSource(StateStore(config.state_dir))
        self.sim: SimulatedNode | None = None
        if config.enforcer is EnforcerKind.SIM:
            assert config.scenario is not None
            self.sim = SimulatedNode(config.scenario, speed=config.speed, clock=clock)
        self.probe: ProbeSource | None = None
        self.probe_error: str | None = None
        if config.probe is not ProbeMode.OFF:
            try:
                self.probe = probe_loader()
            except QPolicyError as error:
                if config.probe is ProbeMode.ON:
                    raise
                self.probe_error = str(error)
        self._clock = clock
        self._pruned_at = clock()
        self._view = NodeView()
        self._stop = threading.Event()
        self.server: MetricsServer | None = None

    def snapshot(self) -> NodeView:
        return self._view

    def tick(self) -> None:
        """Advance every source once and publish a new view."""
        self.state.refresh()
        if self.probe is not None:
            self.probe.refresh()
            if self._clock() - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = self._clock()
                self.probe.prune()
        if self.sim is not None:
            self.sim.advance()
            view = self.sim.view()
            self._view = replace(view, sources={**view.sources, "state": self.state.up})
            return
        self._view = self._state_view()

    def _attribute(
        self, state: DesiredState
    ) -> tuple[dict[str, DriverActivity], list[CgroupActivity]]:
        """Activity per pod (a pod named by a cgroup path owns its subtree) and the rest."""
        owned: dict[str, DriverActivity] = {}
        unmanaged: list[CgroupActivity] = []
        if self.probe is None:
            return owned, unmanaged
        paths = sorted((pod for pod in state.pods if pod.startswith("/")), key=len, reverse=True)
        for cgroup in self.probe.activity().values():
            owner = next((pod for pod in paths if within(cgroup.path, pod)), None)
            if owner is None:
                unmanaged.append(cgroup)
            else:
                previous = owned.get(owner)
                owned[owner] = (
                    cgroup.activity if previous is None else merge(previous, cgroup.activity)
                )
        return owned, unmanaged

    def _state_view(self) -> NodeView:
        state = self.state.state
        owned, unmanaged = self._attribute(state)
        pods: list[PodView] = []
        gpus: list[GpuView] = []
        for index in state.gpu_indices():
            gpu = state.gpu(index)
            members = state.pods_on(index)
            gpus.append(GpuView(str(index), gpu.policy.value, gpu.period_ms / 1000, None))
            try:
                planned = {s.pod: s.allocation for s in plan(gpu, members, {}).slices}
            except QPolicyError:
                planned = {}
            for pod in members:
                pods.append(
                    PodView(
                        gpu=str(index),
                        pod=pod.id,
                        pod_class=pod.pod_class.value,
                        share_target=None if pod.share is None else pod.share / 100,
                        memory_limit=pod.memory_limit,
                        activity=owned.get(pod.id, DriverActivity()),
                        enforcement=Enforcement(planned_share=planned.get(pod.id)),
                    )
                )
        for cgroup in unmanaged:
            pods.append(
                PodView(
                    gpu=",".join(str(g) for g in sorted(cgroup.gpus)) or "none",
                    pod=cgroup.path,
                    pod_class="unmanaged",
                    share_target=None,
                    memory_limit=None,
                    activity=cgroup.activity,
                    enforcement=Enforcement(),
                )
            )
        sources = {"state": self.state.up}
        if self.config.probe is not ProbeMode.OFF:
            sources["probe"] = self.probe is not None and self.probe.up
        return NodeView(pods=tuple(pods), gpus=tuple(gpus), sources=sources)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Serve until stopped; returns the exit status."""
        self.tick()
        if self.config.metrics_addr is not None:
            self.server = serve(self.config.metrics_addr, self.snapshot)
        try:
            while not self._stop.wait(self.config.tick_s):
                self.tick()
        finally:
            if self.server is not None:
                self.server.close()
            if self.probe is not None:
                self.probe.close()
        return 0


def install_signal_handlers(daemon: Daemon) -> None:
    def handle(signum: int, frame: FrameType | None) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
