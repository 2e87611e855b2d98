"""The node's desired state: the state file, cgroup annotations and other pod sources, admitted.

:class:`DesiredSource` reads each source when it may have changed (the state file on every tick,
cheaply; annotations as inotify reports them changed, :mod:`qpolicy.desired.annotationwatch`; a
:class:`PodSource` such as Kubernetes whenever it says it has news) and admits the union
(:mod:`qpolicy.desired.admission`): what comes out always plans. Refusals and unreadable
annotations are logged once each, when they appear or change; the daemon shows them in ``qpolicy
status`` and as metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from qpolicy.desired.admission import Admission, Candidate, Origin, Refusal
from qpolicy.desired.annotations import Annotations
from qpolicy.desired.annotationwatch import AnnotationWatch
from qpolicy.desired.statefile import StateFileSource
from qpolicy.model import GpuConfig, PodSpec
from qpolicy.state import DesiredState, StateStore

log = logging.getLogger(__name__)


class PodSource(Protocol):
    """Pods from elsewhere (Kubernetes): polled from the daemon's loop thread, never blocking."""

    @property
    def name(self) -> str:
        """The source's name in metrics (``qpolicy_<name>_up``) and ``qpolicy status``."""
        ...

    @property
    def up(self) -> bool: ...

    def refresh(self) -> bool:
        """Take in what changed since the last call; True when candidates or GPUs changed."""
        ...

    def candidates(self) -> Sequence[Candidate]: ...

    def gpus(self) -> Mapping[int, GpuConfig]:
        """Per-GPU policies this source configures (the state file's win)."""
        ...

    def refused(self, refusals: Mapping[str, Refusal]) -> None:
        """Told which of its pods admission refused, after each admission."""
        ...

    def names(self) -> Mapping[str, tuple[str, str]]:
        """Pod id -> (namespace, name) where the pod is a Kubernetes pod (for metrics)."""
        ...

    def problems(self) -> Mapping[str, str]:
        """Pod id -> why the pod's own settings could not be taken (a bad value)."""
        ...

    def close(self) -> None:
        """Stop whatever runs in the background."""
        ...


class DesiredSource:
    def __init__(
        self,
        store: StateStore,
        *,
        cgroup_root: Callable[[], Path | None] = lambda: None,
        sources: Sequence[PodSource] = (),
        unenforceable: Callable[[PodSpec], str | None] = lambda pod: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.file = StateFileSource(store)
        self.sources = tuple(sources)
        self._cgroup_root = cgroup_root
        self._unenforceable = unenforceable
        self._clock = clock
        self._admission = Admission()
        self.watch: AnnotationWatch | None = None  # once the cgroup mount is known
        self._first_seen: dict[str, float] = {}
        self.annotations = Annotations()
        self.state = DesiredState()
        self.refused: Mapping[str, Refusal] = {}

    def refresh(self) -> bool:
        """Read what may have changed and admit again if anything did; True if it did."""
        changed = self.file.refresh()
        now = self._clock()
        root = self._cgroup_root()
        if root is not None:
            if self.watch is None or self.watch.root != root:
                self.close()
                self.watch = AnnotationWatch(root, clock=self._clock)
                moved = self.watch.annotations != self.annotations
            else:
                moved = self.watch.refresh()  # False: the watch's annotations are ours already
            annotations = self.watch.annotations
            if moved:
                for path, error in annotations.errors.items():
                    if self.annotations.errors.get(path) != error:
                        log.warning("ignoring the annotations of %s", error)
                self.annotations = annotations
                changed = True
        for source in self.sources:
            changed = source.refresh() or changed
        if changed:
            self._admit(now)
        return changed

    def close(self) -> None:
        """Lets go of the annotation watch's inotify instance."""
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    def _admit(self, now: float) -> None:
        gpus: dict[int, GpuConfig] = {}
        for source in reversed(self.sources):
            gpus.update(source.gpus())
        gpus.update(self.file.state.gpus)
        # One candidate per pod: the state file wins, then the other sources, then annotations.
        candidates: dict[str, Candidate] = {}
        for pod in self.annotations.pods.values():
            candidates[pod.id] = Candidate(pod, Origin.ANNOTATIONS, self._seen(pod.id, now))
        asked: list[set[str]] = []
        for source in reversed(self.sources):
            own = {c.spec.id: c for c in source.candidates()}
            candidates.update(own)
            asked.insert(0, set(own))
        for pod in self.file.state.pods.values():
            candidates[pod.id] = Candidate(pod, Origin.STATE_FILE, self._seen(pod.id, now))
        admitted = self._admission.admit(gpus, candidates.values(), self._unenforceable)
        for pod_id, refusal in admitted.refused.items():
            if self.refused.get(pod_id) != refusal:
                log.warning("%s", refusal.message)
        for pod_id in self.refused:
            if pod_id not in admitted.refused and pod_id in admitted.state.pods:
                log.info("pod %s admitted", pod_id)
        self._first_seen = {p: t for p, t in self._first_seen.items() if p in candidates}
        self.state, self.refused = admitted.state, admitted.refused
        for source, own_ids in zip(self.sources, asked, strict=True):
            source.refused({p: r for p, r in self.refused.items() if p in own_ids})

    def names(self) -> dict[str, tuple[str, str]]:
        """Pod id -> (namespace, name) of the Kubernetes pods among the sources' pods."""
        merged: dict[str, tuple[str, str]] = {}
        for source in reversed(self.sources):
            merged.update(source.names())
        return merged

    def _seen(self, pod: str, now: float) -> float:
        return self._first_seen.setdefault(pod, now)

    def readmit(self) -> None:
        """Admit again now (the enforcer's view of what it can enforce changed)."""
        self._admit(self._clock())
