"""The node as the daemon sees it: the admitted desired state, what the probe saw each pod's
processes do, and what the enforcer measured, joined into one immutable view.

A pod named by a cgroup path owns the activity of every cgroup below it (the nearest pod wins);
cgroups that no pod covers are shown as ``unmanaged``. Pods the node refused and annotations it
could not read are part of the view too, so that ``qpolicy status`` and the metrics say why a pod
is not enforced.
"""

from __future__ import annotations

from collections.abc import Mapping

from qpolicy.backends.base import Backend
from qpolicy.desired.source import DesiredSource
from qpolicy.state import DesiredState
from qpolicy.telemetry.cgroups import within
from qpolicy.telemetry.probesource import CgroupActivity, ProbeSource, merge
from qpolicy.telemetry.view import (
    DriverActivity,
    Enforcement,
    GpuView,
    NodeView,
    PodView,
    RefusedPod,
)


def attribute(
    state: DesiredState, probe: ProbeSource | None, counters: bool = True
) -> tuple[dict[str, DriverActivity], list[CgroupActivity]]:
    """Activity per pod (a pod named by a cgroup path owns its subtree) and the rest; without
    the probe's ioctl counters where ``counters`` is false (ProbeSource.activity)."""
    owned: dict[str, DriverActivity] = {}
    unmanaged: list[CgroupActivity] = []
    if probe is None:
        return owned, unmanaged
    paths = sorted((pod for pod in state.pods if pod.startswith("/")), key=len, reverse=True)
    for cgroup in probe.activity(counters).values():
        owner = next((pod for pod in paths if within(cgroup.path, pod)), None)
        if owner is None:
            unmanaged.append(cgroup)
        else:
            previous = owned.get(owner)
            owned[owner] = cgroup.activity if previous is None else merge(previous, cgroup.activity)
    return owned, unmanaged


def node_view(
    desired: DesiredSource,
    probe: ProbeSource | None,
    backend: Backend,
    sources: Mapping[str, bool],
    counters: bool = True,
) -> NodeView:
    state = desired.state
    names = desired.names()
    owned, unmanaged = attribute(state, probe, counters)
    pods: list[PodView] = []
    gpus: list[GpuView] = []
    for index in state.gpu_indices():
        gpu = state.gpu(index)
        # The period in force: the enforcer's where it stretched the configured one.
        running = backend.period_us(index)
        period_s = gpu.period_ms / 1000 if running is None else running / 1e6
        gpus.append(GpuView(str(index), gpu.policy.value, period_s, None))
        for pod in state.pods_on(index):
            pods.append(
                PodView(
                    gpu=str(index),
                    pod=pod.id,
                    pod_class=pod.pod_class.value,
                    share_target=None if pod.share is None else pod.share / 100,
                    memory_limit=pod.memory_limit,
                    activity=owned.get(pod.id, DriverActivity()),
                    enforcement=backend.enforcement(index, pod.id),
                    namespace=names.get(pod.id, ("", ""))[0],
                    name=names.get(pod.id, ("", ""))[1],
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
    return NodeView(
        pods=tuple(pods),
        gpus=tuple(gpus),
        sources=sources,
        refused=refused_pods(desired),
        probe_lost_events=probe.lost if probe is not None else None,
    )


def refused_pods(desired: DesiredSource) -> tuple[RefusedPod, ...]:
    """What the node did not take on, and annotations it could not read, whatever enforces."""
    names = desired.names()
    refused = [
        RefusedPod(
            str(r.gpu),
            r.pod,
            r.pod_class.value,
            r.origin.label,
            r.reason,
            r.message,
            *names.get(r.pod, ("", "")),
        )
        for r in desired.refused.values()
    ]
    refused += [
        RefusedPod("none", path, "unknown", "annotations", "unreadable", message)
        for path, message in desired.annotations.errors.items()
    ]
    refused += [
        RefusedPod(
            "none", pod, "unknown", source.name, "unreadable", message, *names.get(pod, ("", ""))
        )
        for source in desired.sources
        for pod, message in source.problems().items()
    ]
    return tuple(sorted(refused, key=lambda r: (r.gpu, r.pod)))
