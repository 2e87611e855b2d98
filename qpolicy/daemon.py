"""``qpolicy daemon``: the node agent. Sense, plan, act once per period per GPU; serve metrics.

Everything that schedules runs on one real-time loop thread: the periodic refresh of the desired
state (the state file and the ``user.qpolicy.*`` annotations on cgroups) and of the probe, each
GPU's control loop step at its period, and the slice scheduler's timers. The exporter thread only
reads the immutable view the loop publishes. SIGTERM and SIGINT stop the loop; the enforcer then
opens every channel it closed and restores every timeslice it changed, and the daemon exits 0. A
daemon killed with SIGKILL leaves a record of what it had closed; the next one opens it again
before anything else.

Enforcers (``--enforcer``): ``kmod`` hands each GPU's policy and pods to the qgpu kernel module,
which runs the periods itself (needs the module loaded and CAP_NET_ADMIN); ``rm`` drives a real GPU
from userspace through RM controls (needs root and the eBPF probe); ``sim`` runs a scenario on the
simulated GPU; ``none`` only observes; ``auto`` picks kmod where ``/sys/kernel/qgpu`` exists, rm
where NVIDIA devices exist, and sim otherwise.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import FrameType

from qpolicy.annotations import Annotations, scan
from qpolicy.control import ControlLoop, PeriodicControl
from qpolicy.enforcers.kmod import CGROUP_ROOT, SYSFS_ROOT, KmodEnforcer, QgpuClient, connect
from qpolicy.enforcers.rm import RmEnforcer, RmShared, restore
from qpolicy.engine import plan
from qpolicy.errors import QPolicyError, ValidationError
from qpolicy.model import GpuConfig, PodSpec
from qpolicy.nvrm.tracker import ClientChannels
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.sim.node import SimulatedNode
from qpolicy.sim.scenario import Scenario
from qpolicy.sim.scenarios import builtin
from qpolicy.state import DesiredState, StateStore
from qpolicy.telemetry.cgroups import cgroup2_mount, within
from qpolicy.telemetry.exporter import MetricsServer, serve
from qpolicy.telemetry.probesource import CgroupActivity, ProbeSource, merge
from qpolicy.telemetry.view import DriverActivity, Enforcement, GpuView, NodeView, PodView

log = logging.getLogger(__name__)

# How often cgroups that are gone are dropped from the probe's maps (which have a fixed size).
PRUNE_EVERY_S = 10.0
# How often the exporter's view is rebuilt.
PUBLISH_EVERY_S = 1.0
# How often the cgroup hierarchy is walked for annotations.
ANNOTATIONS_EVERY_S = 1.0
QGPU_SYSFS = SYSFS_ROOT
NVIDIA_CTL = Path("/dev/nvidiactl")


class EnforcerKind(StrEnum):
    AUTO = "auto"
    KMOD = "kmod"
    RM = "rm"
    SIM = "sim"
    NONE = "none"


class ProbeMode(StrEnum):
    """Whether to load the eBPF probe: ``auto`` tries and carries on without it."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


def choose_enforcer(
    kind: EnforcerKind, *, qgpu: Path = QGPU_SYSFS, nvidia: Path = NVIDIA_CTL
) -> EnforcerKind:
    if kind is not EnforcerKind.AUTO:
        return kind
    if qgpu.exists():
        return EnforcerKind.KMOD
    return EnforcerKind.RM if nvidia.exists() else EnforcerKind.SIM


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    enforcer: EnforcerKind
    state_dir: Path
    metrics_addr: str | None
    scenario: Scenario | None = None
    speed: float = 1.0
    tick_s: float = 0.1
    probe: ProbeMode = ProbeMode.OFF
    cgroup_root: Path | None = None
    #: Under the rm enforcer, the shortest turn an offline pod gets when pods take turns: each
    #: hand-over costs two RM controls of about a millisecond of CPU each.
    min_turn_ms: float = 200.0

    def __post_init__(self) -> None:
        if self.enforcer is EnforcerKind.SIM and self.scenario is None:
            raise ValidationError("--enforcer sim needs a scenario (--scenario NAME|FILE)")
        if not 0.01 <= self.tick_s <= 10:
            raise ValidationError(f"invalid tick {self.tick_s!r} s: must be from 0.01 to 10")
        if not 0 <= self.min_turn_ms <= 10_000:
            raise ValidationError(
                f"invalid minimum turn {self.min_turn_ms!r} ms: must be from 0 to 10000"
            )


class StateSource:
    """The desired-state file, re-read when it changes; the last good state survives a bad one."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.state = DesiredState()
        self.up = False
        self.error: str | None = None
        self._seen: tuple[float, int] | None = None

    def refresh(self) -> bool:
        """Re-read if the file changed; True when the state may have changed."""
        try:
            stat = self.store.path.stat()
            stamp = (stat.st_mtime, stat.st_ino)
        except FileNotFoundError:
            stamp = (0.0, 0)
        except OSError as error:
            self.up, self.error = False, str(error)
            return False
        if stamp == self._seen and self.up:
            return False
        try:
            self.state = self.store.load()
        except QPolicyError as error:
            self.up, self.error = False, str(error)
            return False
        self.up, self.error, self._seen = True, None, stamp
        return True


def load_probe() -> ProbeSource:
    from qpolicy.telemetry.probe import NvProbe  # bcc is imported only when a probe is wanted

    return ProbeSource(NvProbe().start())


def merged_state(state: DesiredState, annotations: Annotations) -> DesiredState:
    """The state file's pods plus annotated cgroups it does not name (the file wins)."""
    pods = {pod.id: pod for pod in annotations.pods.values()}
    pods.update(state.pods)
    return replace(state, pods=pods)


class ProbeResolver:
    """Pods to processes for the rm enforcer: a pod named by a cgroup path owns its subtree."""

    def __init__(self, probe: ProbeSource, pods: Callable[[], Mapping[str, PodSpec]]) -> None:
        self.probe = probe
        self._pods = pods
        # Owners per cgroup id for one desired state: launches are read every poll.
        self._owners: dict[int, str | None] = {}
        self._owners_of: Mapping[str, PodSpec] | None = None

    def _owner(self, cgroup: int | None) -> str | None:
        if cgroup is None:
            return None
        pods = self._pods()
        if pods is not self._owners_of:
            self._owners, self._owners_of = {}, pods
        if cgroup in self._owners:
            return self._owners[cgroup]
        path = self.probe.view.cgroups.path_of(cgroup)
        if path is None:
            return None  # not known yet: ask again next time
        owners = [pod for pod in pods if pod.startswith("/") and within(path, pod)]
        owner = max(owners, key=len) if owners else None
        self._owners[cgroup] = owner
        return owner

    def groups(self, pod: str) -> list[ClientChannels]:
        tracker = self.probe.view.tracker
        found: list[ClientChannels] = []
        for pid, proc in tracker.processes.items():
            if self._owner(proc.cgroup) == pod:
                found.extend(tracker.channel_groups(pid))
        return found

    def launches(self) -> Mapping[str, int]:
        totals: dict[str, int] = {}
        for cgroup, count in self.probe.launches().items():
            owner = self._owner(cgroup)
            if owner is not None:
                totals[owner] = totals.get(owner, 0) + count
        return totals


@dataclass
class _Gpu:
    """One GPU under the rm or kmod enforcer: its control loop and when it next steps."""

    periodic: PeriodicControl
    enforcer: RmEnforcer | KmodEnforcer


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe_loader: Callable[[], ProbeSource] = load_probe,
        is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
        kmod_connect: Callable[[], QgpuClient] = connect,
    ) -> None:
        self.kind = choose_enforcer(config.enforcer)
        self.kmod: QgpuClient | None = None
        self._kmod_cgroups: Path | None = None
        if self.kind is EnforcerKind.KMOD:
            self.kmod = kmod_connect()
            try:
                # The module knows pods by cgroup id: without the hierarchy there is nothing to do.
                self._kmod_cgroups = config.cgroup_root or cgroup2_mount()
            except QPolicyError:
                self.kmod.close()
                raise
        if self.kind is EnforcerKind.SIM and config.scenario is None:
            config = replace(config, scenario=builtin("demo"))
        if self.kind is EnforcerKind.RM:
            if not is_root():
                raise QPolicyError(
                    "the rm enforcer needs root: it takes tenants' /dev/nvidiactl descriptors "
                    "(pidfd_getfd) and loads the eBPF probe"
                )
            config = replace(config, probe=ProbeMode.ON)
        self.config = config
        self.state = StateSource(StateStore(config.state_dir))
        self.annotations = Annotations()
        self.desired = DesiredState()
        self.loop = RealtimeLoop(clock)
        self._clock = clock
        self.sim: SimulatedNode | None = None
        if self.kind is EnforcerKind.SIM:
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
        self.rm: RmShared | None = None
        self.restored: tuple[int, list[str]] = (0, [])
        self.gpus: dict[int, _Gpu] = {}
        if self.kind is EnforcerKind.RM:
            config.state_dir.mkdir(parents=True, exist_ok=True)
            self.restored = restore(config.state_dir / "rm-disabled.json")
            self.rm = RmShared(self.loop, config.state_dir)
            if self.probe is not None:
                self.probe.on_exit.append(self.rm.forget)
        self._pruned_at = clock()
        self._annotated_at: float | None = None
        self._view = NodeView()
        self.server: MetricsServer | None = None

    # -- the view ------------------------------------------------------------------------------

    def snapshot(self) -> NodeView:
        return self._view

    def tick(self) -> None:
        """Refresh the sources and publish a new view."""
        self.refresh()
        self.publish()

    def refresh(self) -> None:
        """Read the sources and follow changes of the desired state (every tick)."""
        changed = self.state.refresh()
        now = self._clock()
        root = self._cgroup_root()
        if root is not None and (
            self._annotated_at is None or now - self._annotated_at >= ANNOTATIONS_EVERY_S
        ):
            self._annotated_at = now
            annotations = scan(root)
            if annotations != self.annotations:
                for path, error in annotations.errors.items():
                    if self.annotations.errors.get(path) != error:
                        log.warning("ignoring the annotations of %s", error)
                self.annotations = annotations
                changed = True
        if changed:
            self.desired = merged_state(self.state.state, self.annotations)
            if self.rm is not None or self.kmod is not None:
                self._sync_gpus()
        if self.probe is not None:
            self.probe.refresh()
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = now
                self.probe.prune()
        if self.sim is not None:
            self.sim.advance()

    def publish(self) -> None:
        """Build the view the exporter serves (every second: scrapes come far less often)."""
        if self.sim is not None:
            view = self.sim.view()
            self._view = replace(view, sources={**view.sources, "state": self.state.up})
            return
        self._view = self._state_view()

    def _cgroup_root(self) -> Path | None:
        if self.config.cgroup_root is not None:
            return self.config.cgroup_root
        if self.probe is not None:
            return self.probe.view.cgroups.root
        return self._kmod_cgroups

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

    def _enforcement(self, gpu: int, pod: str, planned: Mapping[str, float]) -> Enforcement:
        driven = self.gpus.get(gpu)
        if driven is None:
            return Enforcement(planned_share=planned.get(pod))
        last = driven.periodic.control.last_plan
        share = None
        if last is not None:
            share = next((s.allocation for s in last.slices if s.pod == pod), None)
        if isinstance(driven.enforcer, KmodEnforcer):
            stats = driven.enforcer.stats.get(pod)
            return Enforcement(
                gpu_time_s=stats.open_ns / 1e9 if stats is not None else 0.0,
                throttled_s=stats.throttled_ns / 1e9 if stats is not None else 0.0,
                planned_share=share,
            )
        return Enforcement(
            gpu_time_s=driven.enforcer.sensor.gpu_time_us(pod) / 1e6,
            throttled_s=driven.enforcer.sensor.throttled_us.get(pod, 0.0) / 1e6,
            planned_share=share,
        )

    def _state_view(self) -> NodeView:
        state = self.desired
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
                        enforcement=self._enforcement(index, pod.id, planned),
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
        if self.kind is EnforcerKind.RM:
            sources["enforcer"] = self.rm is not None
        if self.kind is EnforcerKind.KMOD:
            sources["enforcer"] = self.kmod is not None
        return NodeView(pods=tuple(pods), gpus=tuple(gpus), sources=sources)

    # -- enforcement ---------------------------------------------------------------------------

    def _sync_gpus(self) -> None:
        """Start, update or stop each GPU's control loop to match the desired state."""
        wanted = {
            index: (self.desired.gpu(index), list(self.desired.pods_on(index)))
            for index in self.desired.gpu_indices()
            if self.desired.pods_on(index)
        }
        for index in [i for i in self.gpus if i not in wanted]:
            gone = self.gpus.pop(index)
            gone.periodic.cancel()
            gone.enforcer.release()
        for index, (gpu, pods) in wanted.items():
            driven = self.gpus.get(index)
            if driven is None:
                driven = self._start_gpu(gpu, pods)
                self.gpus[index] = driven
                driven.periodic.step()
                continue
            control = driven.periodic.control
            period_changed = control.gpu.period_ms != gpu.period_ms
            control.gpu = gpu
            control.pods = pods
            if period_changed:
                driven.periodic.step()

    def _start_gpu(self, gpu: GpuConfig, pods: list[PodSpec]) -> _Gpu:
        if self.kmod is not None:
            # The module runs the periods: nothing is gained by stretching them.
            enforcer = KmodEnforcer(
                self.kmod,
                gpu.index,
                pods=lambda: self.desired.pods,
                cgroup_root=self._cgroup_root() or CGROUP_ROOT,
            )
            control = ControlLoop(gpu, pods, enforcer)
            return _Gpu(PeriodicControl(self.loop, control), enforcer)
        assert self.rm is not None and self.probe is not None
        resolver = ProbeResolver(self.probe, lambda: self.desired.pods)
        rm_enforcer = RmEnforcer(self.rm, resolver)
        min_turn = self.config.min_turn_ms * 1000 or None
        control = ControlLoop(gpu, pods, rm_enforcer, min_turn_us=min_turn)
        driven = _Gpu(PeriodicControl(self.loop, control), rm_enforcer)
        rm_enforcer.scheduler.on_wake = driven.periodic.wake
        return driven

    def release(self) -> None:
        """Give every GPU back: open what was closed, restore timeslices, drop descriptors;
        under kmod, unconfigure every pod and leave each GPU best-effort."""
        for driven in self.gpus.values():
            driven.periodic.cancel()
            driven.enforcer.release()
        self.gpus.clear()
        if self.rm is not None:
            self.rm.close()
        if self.kmod is not None:
            self.kmod.close()
            self.kmod = None

    # -- running -------------------------------------------------------------------------------

    def stop(self) -> None:
        self.loop.stop()

    def run(self) -> int:
        """Serve until stopped; returns the exit status."""
        self.tick()
        if self.config.metrics_addr is not None:
            self.server = serve(self.config.metrics_addr, self.snapshot)
        self.loop.every(self.config.tick_s * 1e6, self.refresh)
        self.loop.every(max(PUBLISH_EVERY_S, self.config.tick_s) * 1e6, self.publish)
        try:
            self.loop.run()
        finally:
            self.release()
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
