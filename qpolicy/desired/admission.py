"""Admission: which of the pods that sources ask for the node takes on, and why not the others.

Pods come from several sources at once (the state file, Kubernetes, cgroup annotations), each
valid on its own, and together they may not fit: two annotated pods of 60 % on one fixed-share GPU.
The engine cannot plan such a GPU, so the state that reaches it is made to fit here, where pods
enter, and never later:

* pods already admitted stay, in the order they were admitted: a newcomer that does not fit is
  refused, not a pod that is running (Kubernetes' "the last to arrive is refused");
* a pod whose spec changed keeps its place if the new spec fits, else its last admitted spec, and
  the change is refused;
* newcomers are taken by source (the state file first: it is the administrator's explicit word;
  then Kubernetes; then annotations), then by arrival;
* a pod the enforcer cannot enforce (a name where it needs a cgroup) is refused with the reason;
* a configured pod governs its whole cgroup subtree: annotations on a cgroup below one are not
  taken. Whoever may write them there (a tenant with a delegated subtree, a container) must not
  give itself a class, share or memory limit its pod does not have. To subdivide a pod, the
  administrator configures the children in the state file.

Every refusal says why in one line; the daemon logs it once, shows it in ``qpolicy status`` and
exports it as a metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import IntEnum

from qpolicy.model import GpuConfig, PodClass, PodSpec, fit_problem
from qpolicy.state import DesiredState


class Origin(IntEnum):
    """Where a pod was asked for; lower values are taken first."""

    STATE_FILE = 0
    KUBERNETES = 1
    ANNOTATIONS = 2

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod a source asks for. ``arrived`` orders the pods of one source (creation time, or when
    the source first saw the pod)."""

    spec: PodSpec
    origin: Origin
    arrived: float = 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a pod (or a change to it) was not taken. ``reason`` is a short code for metrics."""

    pod: str
    gpu: int
    pod_class: PodClass
    origin: Origin
    reason: str
    message: str
    #: The pod still runs with its last admitted spec; only the change was refused.
    kept: bool = False


@dataclass(frozen=True, slots=True)
class Admitted:
    state: DesiredState
    refused: Mapping[str, Refusal]


class Admission:
    """Remembers what it admitted, so that later calls keep running pods ahead of newcomers."""

    def __init__(self) -> None:
        # Pod id -> the spec admitted, in admission order.
        self._admitted: dict[str, PodSpec] = {}

    def admit(
        self,
        gpus: Mapping[int, GpuConfig],
        candidates: Iterable[Candidate],
        unenforceable: Callable[[PodSpec], str | None] = lambda pod: None,
    ) -> Admitted:
        """Admit what fits of ``candidates`` on ``gpus`` (one candidate per pod id).

        ``unenforceable`` says why the enforcer cannot carry a pod out, or None if it can.
        """
        state = DesiredState(gpus=gpus)
        wanted = {c.spec.id: c for c in candidates}
        refused: dict[str, Refusal] = {}
        placed: dict[int, list[PodSpec]] = {}
        admitted: dict[str, PodSpec] = {}

        def refuse(c: Candidate, reason: str, message: str, kept: bool = False) -> None:
            refused[c.spec.id] = Refusal(
                c.spec.id, c.spec.gpu, c.spec.pod_class, c.origin, reason, message, kept
            )

        def fits(pod: PodSpec) -> tuple[str, str] | None:
            problem = fit_problem(state.gpu(pod.gpu), [*placed.get(pod.gpu, ()), pod])
            return None if problem is None else (problem[0].value, problem[1])

        def place(pod: PodSpec) -> None:
            placed.setdefault(pod.gpu, []).append(pod)
            admitted[pod.id] = pod

        cgroups = {p for p in wanted if p.startswith("/")}
        by_id: dict[str, Candidate] = {}
        for pod_id, c in wanted.items():
            why = unenforceable(c.spec)
            ancestor = _configured_ancestor(pod_id, cgroups)
            if why is not None:
                refuse(c, "unenforceable", f"pod {pod_id}: {why}")
            elif c.origin is Origin.ANNOTATIONS and ancestor is not None:
                refuse(
                    c,
                    "nested",
                    f"annotations of {pod_id} ignored: it is inside pod {ancestor}, which governs "
                    "its whole subtree",
                )
            else:
                by_id[pod_id] = c

        # Running pods first, unchanged ones before changed ones, each in admission order.
        running = [(by_id[p], spec) for p, spec in self._admitted.items() if p in by_id]
        unchanged = [c for c, spec in running if c.spec == spec]
        changed = [c for c, spec in running if c.spec != spec]
        newcomers = sorted(
            (c for p, c in by_id.items() if p not in self._admitted),
            key=lambda c: (c.origin, c.arrived, c.spec.id),
        )
        for c in unchanged:
            problem = fits(c.spec)
            if problem is None:
                place(c.spec)
            else:  # the GPU's policy changed under it
                refuse(c, problem[0], f"pod {c.spec.id} dropped: {problem[1]}")
        for c in changed:
            problem = fits(c.spec)
            if problem is None:
                place(c.spec)
                continue
            before = self._admitted[c.spec.id]
            if fits(before) is None:
                place(before)
                refuse(c, problem[0], f"pod {c.spec.id}: change refused: {problem[1]}", kept=True)
            else:
                refuse(c, problem[0], f"pod {c.spec.id} dropped: {problem[1]}")
        for c in newcomers:
            problem = fits(c.spec)
            if problem is None:
                place(c.spec)
            else:
                refuse(c, problem[0], f"pod {c.spec.id} refused: {problem[1]}")
        self._admitted = admitted
        return Admitted(DesiredState(gpus=gpus, pods=admitted), refused)


def _configured_ancestor(pod_id: str, cgroups: AbstractSet[str]) -> str | None:
    """The nearest strict ancestor of cgroup ``pod_id`` among ``cgroups``, if any."""
    if not pod_id.startswith("/"):
        return None
    parts = pod_id.split("/")
    for end in range(len(parts) - 1, 1, -1):
        ancestor = "/".join(parts[:end])
        if ancestor in cgroups:
            return ancestor
    return None
