"""The kmod enforcer: the desired state handed to qgpu.ko, which runs the periods itself.

The module gates each cgroup's channels from an hrtimer, limits device memory at allocation time
and measures every cgroup (kmod/uapi/qgpu.h). So there is no control loop on this side: the
enforcer is a reconciler. When the desired state changes it pushes what differs (each GPU's
policy and period, each pod's class, share and memory limit); at the daemon's publish rate it reads
the module's counters back. A pod is a cgroup v2 directory and the module knows it by its cgroup
id, the directory's inode number; a configured cgroup governs its whole subtree (the module finds
the nearest configured ancestor of a process's cgroup).

The module keeps its configuration when a daemon dies without releasing it, so the first push also
deletes the cgroups configured that the desired state does not name: their shares would otherwise
count against the new ones under fixed-share.

Each GPU's TSG timeslices come with its policy and period: the GPU's online strategy
(qpolicy/enforcers/strategy.py, from ``qpolicy doctor``'s result for that GPU, read once when the
GPU is first pushed). The module sets them on the TSGs of the GPU's pods while the GPU has an online
pod, as the engine plans them, and gives each TSG its own back otherwise. A strategy that also asks
CTA compute preemption for offline contexts (``cta+timeslice-1us-8ms``) has the module set that mode
on each offline TSG it gives the offline timeslice, through the same kernel RM client, and give the
context its own mode back with its timeslice.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qpolicy.enforcers.kmod.client import (
    CLASSES,
    POLICIES,
    CgroupStats,
    GpuStats,
    QgpuClient,
)
from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.enforcers.kmod.uapi import SHARE_MAX, CgroupClass, Policy, Preemption
from qpolicy.enforcers.strategy import DEFAULT, OnlineStrategy
from qpolicy.model import GpuConfig, PodIdKind, PodSpec, pod_id_kind
from qpolicy.nvrm import abi
from qpolicy.state import DesiredState
from qpolicy.telemetry.cgroups import CGROUP_ROOT, CgroupError, cgroup_id

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuSettings:
    """What the enforcer told the module about one GPU."""

    policy: Policy
    period_us: int
    offline_timeslice_us: int
    online_timeslice_us: int
    offline_preemption: Preemption = Preemption.OWN


def module_preemption(mode: int | None) -> Preemption | None:
    """The module's offline preemption for a strategy's (an NV2080 compute mode, or None: the
    contexts' own). CTA is the one mode a strategy asks for and the one the module sets; None
    for any other."""
    if mode is None:
        return Preemption.OWN
    return Preemption.CTA if mode == abi.PREEMPTION_MODE_CTA else None


@dataclass(frozen=True, slots=True)
class CgroupConfig:
    """What the enforcer told the module about one pod."""

    cgroup_id: int
    gpu: int
    klass: CgroupClass
    share: int
    mem_limit: int


def kernel_shares(pods: list[PodSpec]) -> dict[str, int]:
    """The SHARE each pod of one GPU is given.

    Fixed- and burst-share pods all carry a share. Best-effort ones need not, and the module reads
    none under best-effort, but CGROUP_SET takes a share from 1 to 100: a pod without one gets an
    equal part of what the pods with one leave, roughly what best-effort gives busy pods, so the
    module's view (``qpolicy status``) reads sensibly.
    """
    own = {p.id: p.share for p in pods if p.share is not None}
    without = [p.id for p in pods if p.share is None]
    left = SHARE_MAX - sum(own.values())
    equal = max(1, left // len(without)) if without else 0
    return own | dict.fromkeys(without, equal)


def unenforceable(pod: PodSpec) -> str | None:
    """Why qgpu.ko cannot govern ``pod``, or None: it knows cgroups, not names."""
    if pod_id_kind(pod.id) is PodIdKind.CGROUP:
        return None
    return (
        "qgpu.ko governs cgroups: name the pod by its cgroup path (/kubepods.slice/...); "
        "Kubernetes pods are found by their cgroup under `qpolicy daemon --kubernetes`"
    )


class KmodEnforcer:
    """Reconciles qgpu.ko's configuration with the desired state, for every GPU of the node."""

    name = "kmod"

    def __init__(
        self,
        client: QgpuClient,
        *,
        cgroup_root: Path = CGROUP_ROOT,
        strategy: Callable[[int], OnlineStrategy] = lambda gpu: DEFAULT,
    ) -> None:
        self.client = client
        self.cgroup_root = cgroup_root
        self._strategy = strategy
        self._strategies: dict[int, OnlineStrategy] = {}
        self._state = DesiredState()
        self._pushed: dict[str, CgroupConfig] = {}
        self._gpus_pushed: dict[int, GpuSettings] = {}
        self._stats: dict[str, CgroupStats] = {}
        self._gpu_stats: dict[int, GpuStats] = {}
        self._complaints: dict[str, str] = {}
        self._adopted = False
        self._pending = False  # something could not be pushed and is tried again
        #: Whether the module answered the last command (None: none sent yet).
        self.up: bool | None = None

    @property
    def configured(self) -> Mapping[str, CgroupConfig]:
        """The pods the module has been told about, as it was told."""
        return self._pushed

    def stats(self, pod: str) -> CgroupStats | None:
        """The pod's counters as of the last :meth:`read`."""
        return self._stats.get(pod)

    @property
    def gpu_stats(self) -> Mapping[int, GpuStats]:
        return self._gpu_stats

    def strategy(self, gpu: int) -> OnlineStrategy:
        """The GPU's online strategy: its timeslices, read once per GPU."""
        strategy = self._strategies.get(gpu)
        if strategy is None:
            strategy = self._strategies[gpu] = self._strategy(gpu)
            log.info(
                "GPU %d: offline timeslice %d us, online %d us, from %s",
                gpu,
                strategy.offline_timeslice_us,
                strategy.online_timeslice_us,
                strategy.source,
            )
        return strategy

    @property
    def strategies(self) -> Mapping[int, OnlineStrategy]:
        """The strategies read so far, by GPU."""
        return self._strategies

    # -- pushing ---------------------------------------------------------------------------------

    def sync(self, state: DesiredState) -> None:
        """Make the module's configuration the desired state's (only what differs is sent)."""
        self._state = state
        self._push()

    def retry(self) -> None:
        """Try again what could not be pushed (a cgroup that did not exist yet, a refusal)."""
        if self._pending:
            self._push()

    def _push(self) -> None:
        self._pending = False
        wanted: dict[str, CgroupConfig] = {}
        for index in self._state.gpu_indices():
            pods = list(self._state.pods_on(index))
            shares = kernel_shares(pods)
            for spec in pods:
                cgroup = self._resolve(spec.id)
                if cgroup is not None:
                    klass = CLASSES[spec.pod_class]
                    limit = spec.memory_limit or 0
                    wanted[spec.id] = CgroupConfig(cgroup, index, klass, shares[spec.id], limit)
        if not self._adopted:
            self._adopt({config.cgroup_id for config in wanted.values()})
        for pod in [pod for pod in self._pushed if pod not in wanted]:
            self._remove(pod)
        changes = [(pod, c) for pod, c in wanted.items() if self._pushed.get(pod) != c]
        # Shares that go down (or leave a GPU) go first and the policies after them, so that no
        # GPU's shares sum past 100 on the way from one state to the next.
        first = [
            (pod, c)
            for pod, c in changes
            if pod in self._pushed
            and (c.share < self._pushed[pod].share or c.gpu != self._pushed[pod].gpu)
        ]
        for pod, config in first:
            self._push_pod(pod, config)
        for index in self._state.gpu_indices():
            self._push_gpu(self._state.gpu(index))
        for index in [i for i in self._gpus_pushed if i not in self._state.gpu_indices()]:
            self._push_gpu(GpuConfig(index))  # no longer configured: best-effort
        for pod, config in changes:
            if (pod, config) not in first:
                self._push_pod(pod, config)

    def _complain(self, key: str, message: str) -> None:
        if self._complaints.get(key) != message:
            self._complaints[key] = message
            log.warning("%s", message)

    def _settled(self, key: str) -> None:
        if self._complaints.pop(key, None) is not None:
            log.info("%s: configured", key)

    def _resolve(self, pod: str) -> int | None:
        pushed = self._pushed.get(pod)
        if pushed is not None:
            return pushed.cgroup_id
        try:
            return cgroup_id(pod, self.cgroup_root)
        except CgroupError as error:
            self._pending = True
            self._complain(
                f"pod {pod}", f"pod {pod}: not enforced until its cgroup exists: {error}"
            )
            return None

    def _adopt(self, wanted: set[int]) -> None:
        try:
            configured = self.client.cgroups()
        except KmodError as error:
            self._pending = True
            self.up = False
            self._complain("adopt", f"cannot read what qgpu.ko has configured: {error}")
            return
        self._adopted = True
        for stats in configured:
            if stats.cgroup_id in wanted:
                continue
            log.info("deleting cgroup #%d, left configured in qgpu.ko", stats.cgroup_id)
            try:
                self.client.del_cgroup(stats.cgroup_id)
            except KmodError as error:
                if error.errno != errno.ENOENT:
                    log.warning("%s", error)

    def _push_gpu(self, gpu: GpuConfig) -> None:
        strategy = self.strategy(gpu.index)
        preemption = module_preemption(strategy.offline_preemption)
        if preemption is None and gpu.index not in self._gpus_pushed:
            log.warning(
                "GPU %d: %s asks compute preemption mode %s for offline contexts, which "
                "qgpu.ko does not set; they keep their own",
                gpu.index,
                strategy.source,
                strategy.offline_preemption,
            )
        wanted = GpuSettings(
            POLICIES[gpu.policy],
            gpu.period_us,
            strategy.offline_timeslice_us,
            strategy.online_timeslice_us,
            Preemption.OWN if preemption is None else preemption,
        )
        if self._gpus_pushed.get(gpu.index) == wanted:
            return
        key = f"GPU {gpu.index}"
        try:
            self.client.set_gpu(
                gpu.index,
                wanted.policy,
                wanted.period_us,
                offline_timeslice_us=wanted.offline_timeslice_us,
                online_timeslice_us=wanted.online_timeslice_us,
                offline_preemption=wanted.offline_preemption,
            )
        except KmodError as error:
            self._failed(key, f"{key}: {error}")
            return
        self.up = True
        self._gpus_pushed[gpu.index] = wanted
        self._settled(key)

    def _push_pod(self, pod: str, config: CgroupConfig) -> None:
        key = f"pod {pod}"
        try:
            self.client.set_cgroup(
                config.cgroup_id, config.gpu, config.klass, config.share, config.mem_limit
            )
        except KmodError as error:
            self._failed(key, f"{key}: {error}")
            return
        self.up = True
        self._pushed[pod] = config
        self._settled(key)

    def _failed(self, key: str, message: str) -> None:
        self._pending = True
        self.up = False
        self._complain(key, message)

    def _remove(self, pod: str) -> bool:
        config = self._pushed[pod]
        try:
            self.client.del_cgroup(config.cgroup_id)
        except KmodError as error:
            if error.errno != errno.ENOENT:  # ENOENT: the module forgot it already
                self._failed(f"pod {pod}", f"pod {pod}: {error}")
                return False
        del self._pushed[pod]
        self._stats.pop(pod, None)
        self._complaints.pop(f"pod {pod}", None)
        return True

    # -- reading ---------------------------------------------------------------------------------

    def read(self) -> None:
        """Read every configured cgroup's and GPU's counters (two dumps, at publish rate)."""
        try:
            by_id = {s.cgroup_id: s for s in self.client.cgroups()}
            self._gpu_stats = {g.gpu: g for g in self.client.gpus()}
        except KmodError as error:
            self.up = False
            self._complain("stats", f"cannot read qgpu.ko's counters: {error}")
            return
        self.up = True
        self._settled("stats")
        for pod, config in list(self._pushed.items()):
            stats = by_id.get(config.cgroup_id)
            if stats is None:
                # The module drops a cgroup that is removed (EVENT_CGROUP_GONE); one of the same
                # path made later is another cgroup, to be looked up again.
                log.info("pod %s: its cgroup is gone", pod)
                del self._pushed[pod]
                self._stats.pop(pod, None)
                self._pending = True
                continue
            self._stats[pod] = stats

    # -- giving back -----------------------------------------------------------------------------

    def release(self) -> None:
        """Delete every cgroup configured here and leave every GPU best-effort."""
        for pod in list(self._pushed):
            if not self._remove(pod):
                log.warning("pod %s: left configured in qgpu.ko", pod)
        for index in list(self._gpus_pushed):
            try:
                self.client.set_gpu(index, Policy.BEST_EFFORT)
            except KmodError as error:
                log.warning("GPU %d: not left best-effort: %s", index, error)
        self._gpus_pushed.clear()
        self._stats.clear()
