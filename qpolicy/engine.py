"""The policy engine: which pod gets how much of one GPU in the next period.

:func:`plan` is a pure function of the GPU's policy, its pods and their demand. It does no I/O and
keeps no state, so the daemon, the simulator and the tests all ask it the same question.

Semantics (ARCHITECTURE.md, "Vocabulary"):

* **best-effort**: no caps; busy pods split the GPU equally, work conserving.
* **fixed-share**: a pod never gets more than its share, even on an idle GPU.
* **burst-share**: a busy pod is guaranteed its share; idle time (unallocated, or allocated to idle
  pods) goes to busy pods in proportion to their shares.
* **online before offline**: online pods are served first in every period. Under best-effort they
  take what they want and offline pods split the rest. Under burst-share every busy pod keeps its
  guarantee, but online pods take the idle time first. Under fixed-share caps are per pod, so the
  class only orders the period.

*demand* is, per pod, the fraction of the period it would use if nobody else ran (0 = idle,
1 = saturating). Pods missing from it are idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec, check_pods_fit

# TSG timeslices set for each class while a GPU has online pods. A long online timeslice means an
# online request, once on the GPU, is not preempted by offline work; a short offline one means an
# online request waits at most that long for the running offline context to yield
# (docs/gpu-measurements.md §2: offline 128 µs / online 8192 µs cut the online p99 from 2.46 to
# 0.67 ms on the H200 in 2026-11-20; docs/levers.md: on 2026-11-24 they cut the online p50 from
# 1.7 to 0.7 ms on an H100 and an H200). Offline 1 µs (GPreempt's value) since 2026-11-26: in
# every comparison on one host with 3 001 requests it was as good or better than 128 µs (8192
# trainer, H100: p50 / p99 0.64 / 0.75 against 0.69 / 0.83 ms; two offline pods 0.64 / 0.77
# against 0.67 / 0.82; two online pods 0.76 / 1.30 against 0.91 / 1.39; H200: 0.62 / 0.87 against
# 0.68 / 1.18; the 2048 trainer alike both ways; next to requests of four kernels with host gaps
# the trainer kept 426 it/s against 429 / 431), the trainers kept 98-100 % (BENCHMARKS.md,
# seventh and eighth sessions). It was made the default once before and taken back when nvmock's
# engine gave a lone TSG a new turn per microsecond (the VM's offline pod kept 20 % of native);
# the engine now follows the hardware there (kmod/nvmock/CONFORMANCE.md). These are defaults: the
# enforcers take the values `qpolicy doctor` found best on the GPU where it ran
# (qpolicy/enforcers/strategy.py), and nodes without PyTorch for the doctor run on these.
ONLINE_TIMESLICE_US = 8192
OFFLINE_TIMESLICE_US = 1


class Slice(NamedTuple):
    """What one pod gets in one period.

    ``allocation`` is the fraction of the period's GPU time planned for the pod. ``cap`` is the most
    it may use in the period before its channels are closed; ``None`` means it is never throttled
    (work-conserving policies hand out idle time at run time). ``weight`` is the pod's part of
    such idle time relative to the other pods of its class (its share under burst-share, equal
    parts under best-effort). ``timeslice_us`` is the hardware timeslice for the pod's channel
    groups; ``None`` leaves the pod's own setting.

    A named tuple rather than a dataclass: a node plans a thousand of these every period.
    """

    pod: str
    pod_class: PodClass
    share: int | None
    demand: float
    allocation: float
    cap: float | None
    timeslice_us: int | None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Plan:
    """The slices of one GPU for one period, online pods first, each class ordered by pod id."""

    gpu: int
    policy: GpuPolicy
    period_us: int
    slices: tuple[Slice, ...]

    @property
    def work_conserving(self) -> bool:
        return self.policy.work_conserving

    @property
    def allocated(self) -> float:
        return sum(s.allocation for s in self.slices)

    def slice(self, pod: str) -> Slice:
        for s in self.slices:
            if s.pod == pod:
                return s
        raise KeyError(pod)


def waterfill(capacity: float, items: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Weighted max-min fair division of ``capacity`` among ``(key, weight, want)`` items.

    Nobody gets more than it wants; whoever is not satisfied gets capacity in proportion to its
    weight. Sorting by want/weight lets one pass settle every item: once the item with the smallest
    ratio cannot be satisfied at the current level, none of the rest can.
    """
    result = {key: 0.0 for key, _, _ in items}
    live = sorted(
        ((key, weight, want) for key, weight, want in items if want > 0 and weight > 0),
        key=lambda item: (item[2] / item[1], item[0]),
    )
    remaining = max(capacity, 0.0)
    weight_left = sum(weight for _, weight, _ in live)
    for index, (key, weight, want) in enumerate(live):
        level = remaining * weight / weight_left
        if want <= level:
            result[key] = want
            remaining -= want
            weight_left -= weight
            continue
        for rest_key, rest_weight, _ in live[index:]:
            result[rest_key] = remaining * rest_weight / weight_left
        break
    return result


def _clamp_demand(pod: str, value: float) -> float:
    if value != value:  # NaN
        raise ValueError(f"demand of pod {pod!r} is NaN")
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else float(value)


def plan(gpu: GpuConfig, pods: Iterable[PodSpec], demand: Mapping[str, float]) -> Plan:
    """Plan the next period of ``gpu`` for the pods placed on it.

    Pods of other GPUs are ignored. Raises :class:`~qpolicy.errors.PlanError` when the shares do
    not fit (fixed-share and burst-share need a share per pod, summing to at most 100).
    """
    on_gpu = sorted(
        (p for p in pods if p.gpu == gpu.index),
        key=lambda p: (p.pod_class is not PodClass.ONLINE, p.id),
    )
    check_pods_fit(gpu, on_gpu)
    wants = {p.id: _clamp_demand(p.id, demand.get(p.id, 0.0)) for p in on_gpu}
    online = [p for p in on_gpu if p.pod_class is PodClass.ONLINE]
    offline = [p for p in on_gpu if p.pod_class is PodClass.OFFLINE]

    if gpu.policy is GpuPolicy.FIXED_SHARE:
        alloc = {p.id: min(wants[p.id], _share(p)) for p in on_gpu}
        caps: dict[str, float | None] = {p.id: _share(p) for p in on_gpu}
    elif gpu.policy is GpuPolicy.BEST_EFFORT:
        alloc = waterfill(1.0, [(p.id, 1.0, wants[p.id]) for p in online])
        alloc |= waterfill(1.0 - sum(alloc.values()), [(p.id, 1.0, wants[p.id]) for p in offline])
        caps = {p.id: None for p in on_gpu}
    else:
        alloc, caps = _burst_share(on_gpu, online, offline, wants)

    timeslices: dict[PodClass, int | None] = {
        PodClass.ONLINE: ONLINE_TIMESLICE_US if online else None,
        PodClass.OFFLINE: OFFLINE_TIMESLICE_US if online else None,
    }
    # Idle time is handed out by share under burst-share (as _burst_share does), equally under
    # best-effort; fixed-share hands none out.
    equal = gpu.policy is GpuPolicy.BEST_EFFORT
    slices = tuple(
        Slice(
            p.id,
            p.pod_class,
            p.share,
            wants[p.id],
            alloc[p.id],
            caps[p.id],
            timeslices[p.pod_class],
            1.0 if equal or p.share is None else float(p.share),
        )
        for p in on_gpu
    )
    return Plan(gpu=gpu.index, policy=gpu.policy, period_us=gpu.period_us, slices=slices)


def _burst_share(
    on_gpu: Sequence[PodSpec],
    online: Sequence[PodSpec],
    offline: Sequence[PodSpec],
    wants: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, float | None]]:
    guaranteed = {p.id: min(wants[p.id], _share(p)) for p in on_gpu}
    idle = 1.0 - sum(guaranteed.values())
    extra = waterfill(idle, [(p.id, _share(p), wants[p.id] - guaranteed[p.id]) for p in online])
    idle -= sum(extra.values())
    extra |= waterfill(idle, [(p.id, _share(p), wants[p.id] - guaranteed[p.id]) for p in offline])
    alloc = {pod: guaranteed[pod] + extra[pod] for pod in guaranteed}
    # Offline pods are work conserving and never capped. An online pod may use anything that is
    # neither guaranteed to a busy offline pod nor allocated to another online pod: that is what it
    # would get if it turned out hungrier than its demand said.
    offline_guarantees = sum(guaranteed[p.id] for p in offline)
    online_total = sum(alloc[p.id] for p in online)
    caps: dict[str, float | None] = {p.id: None for p in offline}
    for p in online:
        others = online_total - alloc[p.id]
        caps[p.id] = max(alloc[p.id], 1.0 - offline_guarantees - others)
    return alloc, caps


def _share(pod: PodSpec) -> float:
    # check_pods_fit has ensured every pod has a share under the policies that read it.
    return (pod.share or 0) / 100.0


def plan_node(
    gpus: Mapping[int, GpuConfig], pods: Iterable[PodSpec], demand: Mapping[str, float]
) -> dict[int, Plan]:
    """Plan every GPU of a node that has pods (or a configured policy)."""
    by_gpu: dict[int, list[PodSpec]] = {index: [] for index in gpus}
    for pod in pods:
        by_gpu.setdefault(pod.gpu, []).append(pod)
    return {
        index: plan(gpus.get(index) or GpuConfig(index), members, demand)
        for index, members in sorted(by_gpu.items())
    }
