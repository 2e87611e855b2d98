"""Pods to the channel groups the rm enforcer controls: from the probe, one GPU at a time.

A pod named by a cgroup path owns every process in its subtree (the nearest configured pod wins).
Each process's RM clients and their channels come from the probe's tracker; a client holds one
channel group per GPU it uses, and only the groups on the enforcer's own GPU are its business:
another GPU's channels take turns there, not here.

Which GPU a group is on is asked of RM once per group: the subdevice's gpuId, then that GPU's PCI
address (two controls answered by the kernel side of RM), matched against the node's GPUs by bus
location. Where RM does not answer, RM's device instance stands in for the index (they agree on
hosts where GPUs attached in PCI order), and the log says so once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Protocol

from qpolicy.enforcers.rm.files import BorrowedFiles
from qpolicy.model import PodSpec
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.tracker import ClientChannels
from qpolicy.telemetry.cgroups import within
from qpolicy.telemetry.gpus import GpuInfo
from qpolicy.telemetry.probesource import ProbeSource

log = logging.getLogger(__name__)


class PodResolver(Protocol):
    """What the enforcer of one GPU needs to know about pods."""

    def groups(self, pod: str) -> list[ClientChannels]:
        """The channel groups of the pod's live processes on this GPU."""
        ...

    def launches(self) -> Mapping[str, int]:
        """Cumulative CUDA launches per pod."""
        ...

    def forget(self, pid: int, client: int, handles: Sequence[int]) -> bool:
        """Forget objects RM no longer has; whether any was known."""
        ...

    def launches_of(self, pods: AbstractSet[str]) -> Mapping[str, int]:
        """The same for ``pods`` only, from the cgroups already known to be theirs (a cgroup
        first seen by :meth:`launches`): cheaper where the probe reads single counters."""
        ...


GroupKey = tuple[int, int, int | None]  # pid, client, device


class GpuLocator:
    """Which GPU (index) a channel group's channels are on; one answer per group, kept."""

    def __init__(self, files: BorrowedFiles, gpus: Callable[[], Sequence[GpuInfo]]) -> None:
        self.files = files
        self._gpus = gpus
        self._known: dict[GroupKey, int | None] = {}
        self._guessed = False
        #: Changes whenever an answer is forgotten (what was derived from the answers is stale).
        self.generation = 0

    def gpu_of(self, group: ClientChannels) -> int | None:
        if group.pid is None:
            return None
        key = (group.pid, group.client, group.device)
        if key not in self._known:
            self._known[key] = self._ask(group)
        return self._known[key]

    def _ask(self, group: ClientChannels) -> int | None:
        address = None
        if group.subdevice is not None and group.fd is not None and group.pid is not None:
            try:
                fd = self.files.get(group.pid, group.fd)
                address = rmctl.gpu_pci_address(fd, group.client, group.subdevice)
            except rmctl.RmError as error:
                log.debug("pid %d: cannot ask RM which GPU it uses: %s", group.pid, error)
        gpus = self._gpus()
        if address is not None:
            match = [gpu.index for gpu in gpus if gpu.on_bus(str(address))]
            if match:
                return match[0]
        if len(gpus) == 1:
            return gpus[0].index  # one GPU: nothing to tell apart
        if group.device_instance is not None and not self._guessed:
            self._guessed = True
            log.info(
                "RM did not say which GPU pid %s uses; taking RM's device instance %d for its "
                "index (as for every such process from now on)",
                group.pid,
                group.device_instance,
            )
        return group.device_instance

    def forget(self, pid: int) -> None:
        self.generation += 1
        for key in [k for k in self._known if k[0] == pid]:
            del self._known[key]


class ProbeResolver:
    """Pods to processes for the rm enforcer of GPU ``gpu``, from the probe's view."""

    def __init__(
        self,
        probe: ProbeSource,
        pods: Callable[[], Mapping[str, PodSpec]],
        gpu: int,
        locator: GpuLocator,
    ) -> None:
        self.probe = probe
        self.gpu = gpu
        self.locator = locator
        self._pods = pods
        # Owners per cgroup id for one desired state: launches are read every poll.
        self._owners: dict[int, str | None] = {}
        self._owners_of: Mapping[str, PodSpec] | None = None
        # Each pod's groups, while the tracker, the desired state and the GPU answers stand: a
        # turn switch and each period's timeslice refresh ask, and building them walks every RM
        # object of the pod's processes (~60 us a PyTorch process).
        self._groups: dict[str, list[ClientChannels]] = {}
        self._groups_of: tuple[int, Mapping[str, PodSpec] | None, int] = (-1, None, -1)
        self._unresolved = False

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
            self._unresolved = True
            return None  # not known yet: ask again next time
        owners = [pod for pod in pods if pod.startswith("/") and within(path, pod)]
        owner = max(owners, key=len) if owners else None
        self._owners[cgroup] = owner
        return owner

    def groups(self, pod: str) -> list[ClientChannels]:
        tracker = self.probe.view.tracker
        pods = self._pods()
        of = self._groups_of
        if of[0] != tracker.generation or of[1] is not pods or of[2] != self.locator.generation:
            self._groups.clear()
            self._groups_of = (tracker.generation, pods, self.locator.generation)
        cached = self._groups.get(pod)
        if cached is not None:
            return list(cached)
        self._unresolved = False
        found: list[ClientChannels] = []
        for pid, proc in tracker.processes.items():
            if self._owner(proc.cgroup) == pod:
                found.extend(
                    g for g in tracker.channel_groups(pid) if self.locator.gpu_of(g) == self.gpu
                )
        if not self._unresolved:  # a cgroup not named yet may be this pod's: ask again then
            self._groups[pod] = found
        return list(found)

    def forget(self, pid: int, client: int, handles: Sequence[int]) -> bool:
        return self.probe.view.tracker.forget(pid, client, handles)

    def launches(self) -> Mapping[str, int]:
        totals: dict[str, int] = {}
        for cgroup, count in self.probe.launches().items():
            owner = self._owner(cgroup)
            if owner is not None:
                totals[owner] = totals.get(owner, 0) + count
        return totals

    def launches_of(self, pods: AbstractSet[str]) -> Mapping[str, int]:
        if self._owners_of is not self._pods():
            # The desired state changed since the owners were learnt: read everything.
            return {pod: count for pod, count in self.launches().items() if pod in pods}
        cgroups = [cgroup for cgroup, owner in self._owners.items() if owner in pods]
        totals: dict[str, int] = {}
        for cgroup, count in self.probe.launches_of(cgroups).items():
            owner = self._owners[cgroup]
            if owner is not None:
                totals[owner] = totals.get(owner, 0) + count
        return totals
