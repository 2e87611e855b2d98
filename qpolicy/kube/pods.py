"""What qpolicy derives from a Kubernetes Pod object: a pure function of the object.

The object is the Pod as the API server serves it (JSON, camelCase keys), or a manifest written
by hand; both ``qpolicy kube explain`` and the daemon's watcher call :func:`derive`, so what
explain prints is what the node does.

Where each setting comes from, first found wins:

=========== ===========================================================================
class       annotation ``qpolicy.io/class``; annotation ``tke.cloud.tencent.com/app-class``
            (online, offline: Tencent TKE's qGPU); a container's limit
            ``nvidia.com/priority`` (HAMi: 0 online, 1 offline); the pod's label
            ``koordinator.sh/qosClass`` (LSE, LSR, LS online; BE offline). Else offline.
share       annotation ``qpolicy.io/share`` (percent); the limits ``nvidia.com/gpucores``
            (HAMi: percent of the GPU's cores), summed over the pod's containers.
memory      annotation ``qpolicy.io/memory`` (a Kubernetes quantity); the limits
            ``nvidia.com/gpumem`` (HAMi: MiB), summed.
=========== ===========================================================================

Where two keys give different values, the first wins and the disagreement is reported
(:class:`Conflict`); the daemon puts it in an Event on the pod. A value that is not valid where it
is used is an error (:attr:`PodFacts.errors`), never an exception: the daemon leaves such a pod
unmanaged (or at its last good setting) and says why in an Event; a bad value in a key that lost
to a higher one is only noted. Unknown ``qpolicy.io/`` annotations are errors too: a misspelt key
must not silently drop a setting.

A pod is a GPU pod when a container asks for ``nvidia.com/gpu``, when it carries ``qpolicy.io/``
annotations, or when a container sets ``NVIDIA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any

from qpolicy.errors import ValidationError
from qpolicy.model import (
    MAX_SHARE,
    QUANTITY_SUFFIXES,
    PodClass,
    exact_decimal,
    format_bytes,
    parse_gpu_index,
    parse_memory,
    parse_share,
)
from qpolicy.telemetry.gpus import GpuInfo

PREFIX = "qpolicy.io/"
CLASS = PREFIX + "class"
SHARE = PREFIX + "share"
MEMORY = PREFIX + "memory"
KNOWN = (CLASS, SHARE, MEMORY)
TKE_CLASS = "tke.cloud.tencent.com/app-class"
HAMI_PRIORITY = "nvidia.com/priority"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEMORY = "nvidia.com/gpumem"
KOORDINATOR_QOS = "koordinator.sh/qosClass"
GPU_RESOURCE = "nvidia.com/gpu"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# No value of ours comes near this; longer ones are refused before they are parsed or quoted.
MAX_VALUE_LEN = 256

_KOORDINATOR = {
    "LSE": PodClass.ONLINE,
    "LSR": PodClass.ONLINE,
    "LS": PodClass.ONLINE,
    "BE": PodClass.OFFLINE,
}
# Koordinator classes that say nothing about a GPU tenant's latency.
_KOORDINATOR_SILENT = ("SYSTEM", "NONE")
_HAMI_PRIORITY = {"0": PodClass.ONLINE, "1": PodClass.OFFLINE}
_QOS = ("Guaranteed", "Burstable", "BestEffort")


@dataclass(frozen=True, slots=True)
class Found:
    """One setting: its value and where it came from (``key`` is ``default`` when nowhere)."""

    value: PodClass | int | None
    key: str
    text: str | None = None

    def shown(self) -> str:
        if self.value is None:
            return "-"
        if isinstance(self.value, PodClass):
            return self.value.value
        return str(self.value)


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two keys that set one setting differently; ``used`` won."""

    setting: str
    used: str
    used_value: str
    ignored: str
    ignored_value: str

    @property
    def message(self) -> str:
        return (
            f"{self.setting}: {self.used}={self.used_value!r} is used, "
            f"{self.ignored}={self.ignored_value!r} is ignored"
        )


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    uid: str | None
    qos: str
    qos_from: str
    phase: str
    #: Creation time (seconds since the epoch), where the object has one.
    created: float | None
    #: Why this is a GPU pod; empty: it is not one, and qpolicy leaves it alone.
    gpu_reasons: tuple[str, ...]
    pod_class: Found
    share: Found
    memory: Found
    conflicts: tuple[Conflict, ...] = ()
    #: Bad values, one line each naming the key and the value: the pod is not managed.
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    #: (container, value) of each literal NVIDIA_VISIBLE_DEVICES.
    visible_devices: tuple[tuple[str, str], ...] = ()
    #: Containers that ask for nvidia.com/gpu, with the count.
    gpu_requests: tuple[tuple[str, int], ...] = field(default=())

    @property
    def gpu_pod(self) -> bool:
        return bool(self.gpu_reasons)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def cgroups(self) -> dict[str, str]:
        """The pod's cgroup path under each driver (``<uid>`` where the object has none)."""
        return cgroup_paths(self.uid or "<uid>", self.qos)


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def _long(key: str, text: str) -> str | None:
    if len(text) > MAX_VALUE_LEN:
        return f"{key} is {len(text)} characters long (at most {MAX_VALUE_LEN})"
    return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = _mapping(pod.get("spec"))
    containers = spec.get("containers")
    if not isinstance(containers, list):
        return []
    return [c for c in containers if isinstance(c, Mapping)]


def _resource(container: Mapping[str, Any], name: str) -> object | None:
    """A container's limit for ``name``, else its request (extended resources: both equal)."""
    resources = _mapping(container.get("resources"))
    for part in ("limits", "requests"):
        value: object = _mapping(resources.get(part)).get(name)
        if value is not None:
            return value
    return None


# --- quantities ---------------------------------------------------------------------------------

_QUANTITY = re.compile(r"([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:[eE]([+-]?[0-9]+))?([a-zA-Z]*)")
# The model's suffixes, and milli: a quantity here may be a fraction (a CPU request of 500m).
_SUFFIXES = {
    **{suffix: Fraction(unit) for suffix, unit in QUANTITY_SUFFIXES.items()},
    "m": Fraction(1, 1000),
}


def quantity(value: object) -> Fraction:
    """A Kubernetes resource quantity (``500m``, ``1``, ``2Gi``, ``1e3``) as an exact number."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a quantity")  # JSON's Infinity and NaN, as parsed
    if isinstance(value, int | float):
        return Fraction(value)
    text = _text(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match is None or match.group(3) not in _SUFFIXES:
        raise ValueError(f"{text[:64]!r} is not a quantity")
    mantissa = match.group(1)
    sign = -1 if mantissa.startswith("-") else 1
    number = exact_decimal(mantissa.lstrip("+-"), match.group(2))
    return sign * number * _SUFFIXES[match.group(3)]


def _count(value: object, what: str) -> int:
    """A whole, non-negative quantity (extended resources are counts)."""
    try:
        number = quantity(value)
    except ValueError:
        raise ValidationError(f"invalid {what} {_text(value)!r}: expected a whole number") from None
    if number.denominator != 1 or number < 0:
        raise ValidationError(f"invalid {what} {_text(value)!r}: expected a whole number")
    return int(number)


# --- QoS and cgroups ----------------------------------------------------------------------------


def qos_class(pod: Mapping[str, Any]) -> tuple[str, str]:
    """The pod's QoS class and where it came from: ``status.qosClass`` (set by the API server),
    else computed from the containers' CPU and memory requests and limits as Kubernetes does."""
    status = _mapping(pod.get("status")).get("qosClass")
    if status in _QOS:
        return str(status), "status.qosClass"
    spec = _mapping(pod.get("spec"))
    containers = [
        c
        for part in ("initContainers", "containers")
        for c in _list(spec.get(part))
        if isinstance(c, Mapping)
    ]
    any_set = False
    guaranteed = bool(containers)
    for container in containers:
        resources = _mapping(container.get("resources"))
        requests, limits = _mapping(resources.get("requests")), _mapping(resources.get("limits"))
        for name in ("cpu", "memory"):
            request, limit = requests.get(name), limits.get(name)
            if request is not None or limit is not None:
                any_set = True
            if limit is None:
                guaranteed = False
            elif request is not None:
                try:
                    if quantity(request) != quantity(limit):
                        guaranteed = False
                except ValueError:
                    guaranteed = False
    if not any_set:
        return "BestEffort", "computed from the containers' requests and limits"
    return (
        "Guaranteed" if guaranteed else "Burstable"
    ), "computed from the containers' requests and limits"


def cgroup_paths(uid: str, qos: str) -> dict[str, str]:
    """Where the kubelet puts a pod's cgroup, per cgroup driver (paths below the cgroup2 mount).

    systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`` with
    the UID's dashes written as underscores (systemd reads a dash in a unit name as a nesting
    level); cgroupfs: ``/kubepods/burstable/pod<uid>``. Guaranteed pods sit directly under the
    top (``kubepods-pod<uid>.slice``, ``/kubepods/pod<uid>``).
    """
    escaped = uid.replace("-", "_")
    if qos == "Guaranteed":
        return {
            "systemd": f"/kubepods.slice/kubepods-pod{escaped}.slice",
            "cgroupfs": f"/kubepods/pod{uid}",
        }
    tier = qos.lower()
    return {
        "systemd": f"/kubepods.slice/kubepods-{tier}.slice/kubepods-{tier}-pod{escaped}.slice",
        "cgroupfs": f"/kubepods/{tier}/pod{uid}",
    }


# --- GPUs ---------------------------------------------------------------------------------------


def visible_device_tokens(value: str) -> list[str]:
    """The GPUs an NVIDIA_VISIBLE_DEVICES value names (``0,1``, UUIDs, ``all``); ``none``,
    ``void`` and an empty value name none."""
    text = value.strip()
    if text.lower() in ("", "none", "void"):
        return []
    return [token.strip() for token in text.split(",") if token.strip()]


def resolve_gpus(tokens: Sequence[str], gpus: Sequence[GpuInfo]) -> tuple[list[int], list[str]]:
    """Indexes of the GPUs ``tokens`` name on a node with ``gpus``, and what could not be
    resolved (one line each). ``all`` is every GPU; a device plugin's replica suffix (``::2``) is
    dropped."""
    found: set[int] = set()
    problems: list[str] = []
    for token in tokens:
        name = token.split("::", 1)[0]
        if name.lower() == "all":
            if gpus:
                found.update(g.index for g in gpus)
            else:
                problems.append("'all' names every GPU, and no GPU is known here")
            continue
        if name.upper().startswith("GPU-"):
            match = next(
                (g.index for g in gpus if g.uuid is not None and name.lower() == g.uuid.lower()),
                None,
            )
            if match is None:
                problems.append(f"no GPU of UUID {name!r} here")
            else:
                found.add(match)
            continue
        try:
            found.add(parse_gpu_index(name))
        except ValidationError:
            problems.append(f"{token!r} names no GPU (expected an index or a GPU UUID)")
    return sorted(found), problems


# --- derivation ---------------------------------------------------------------------------------


@dataclass
class _Setting:
    """The keys of one setting in precedence order, as (key, raw value, parser)."""

    name: str
    default: Found
    offers: list[tuple[str, str, Callable[[str], PodClass | int | None]]] = field(
        default_factory=list
    )


def _created(pod: Mapping[str, Any]) -> float | None:
    stamp = _mapping(pod.get("metadata")).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _share_from_cores(text: str) -> int | None:
    total = int(text)
    if total == 0:
        return None  # HAMi: no limit on cores
    if total > MAX_SHARE:
        raise ValidationError(
            f"shares over 100: {HAMI_CORES} adds up to {total} % of one GPU over the pod's "
            "containers"
        )
    return parse_share(total)


def _memory_from_gpumem(text: str) -> int | None:
    mib = int(text)
    return None if mib == 0 else parse_memory(mib * 2**20)


def derive(pod: Mapping[str, Any]) -> PodFacts:
    """Everything qpolicy takes from ``pod`` (a Pod object or manifest as a mapping)."""
    metadata = _mapping(pod.get("metadata"))
    annotations = {
        str(k): _text(v) for k, v in _mapping(metadata.get("annotations")).items() if v is not None
    }
    labels = {str(k): _text(v) for k, v in _mapping(metadata.get("labels")).items()}
    containers = _containers(pod)
    errors: list[str] = []
    notes: list[str] = []
    reasons: list[str] = []
    gpu_requests: list[tuple[str, int]] = []
    visible: list[tuple[str, str]] = []

    for key in sorted(k for k in annotations if k.startswith(PREFIX)):
        if key not in KNOWN:
            known = ", ".join(KNOWN)
            errors.append(f"unknown annotation {key} (known: {known})")
    ours = sorted(k for k in annotations if k in KNOWN)
    if ours:
        reasons.append("annotation(s) " + ", ".join(ours))
    for container in containers:
        cname = _text(container.get("name", "?"))
        asked = _resource(container, GPU_RESOURCE)
        if asked is not None:
            try:
                count = _count(asked, f"{GPU_RESOURCE} of container {cname}")
            except ValidationError as error:
                errors.append(str(error))
                count = 0
            if count > 0:
                gpu_requests.append((cname, count))
                reasons.append(f"container {cname} asks for {GPU_RESOURCE}: {count}")
        env = container.get("env")
        for variable in env if isinstance(env, list) else []:
            if not isinstance(variable, Mapping) or variable.get("name") != VISIBLE_DEVICES:
                continue
            if "value" not in variable:
                notes.append(
                    f"container {cname}: {VISIBLE_DEVICES} comes from valueFrom, which is not read"
                )
                continue
            value = _text(variable.get("value"))
            if visible_device_tokens(value):
                visible.append((cname, value))
                reasons.append(f"container {cname} sets {VISIBLE_DEVICES}={value}")

    pod_class = _Setting("class", Found(PodClass.OFFLINE, "default"))
    share = _Setting("share", Found(None, "default"))
    memory = _Setting("memory", Found(None, "default"))
    if CLASS in annotations:
        pod_class.offers.append((f"annotation {CLASS}", annotations[CLASS], PodClass.parse))
    if TKE_CLASS in annotations:
        pod_class.offers.append((f"annotation {TKE_CLASS}", annotations[TKE_CLASS], PodClass.parse))
    for container in containers:
        priority = _resource(container, HAMI_PRIORITY)
        if priority is not None:
            cname = _text(container.get("name", "?"))
            pod_class.offers.append(
                (f"container {cname} limit {HAMI_PRIORITY}", _text(priority), _hami_priority)
            )
    if KOORDINATOR_QOS in labels:
        qos_label = labels[KOORDINATOR_QOS]
        if qos_label.strip().upper() in _KOORDINATOR_SILENT:
            notes.append(f"label {KOORDINATOR_QOS}={qos_label} says nothing about GPU latency")
        else:
            pod_class.offers.append((f"label {KOORDINATOR_QOS}", qos_label, _koordinator))
    if SHARE in annotations:
        share.offers.append((f"annotation {SHARE}", annotations[SHARE], parse_share))
    if MEMORY in annotations:
        memory.offers.append((f"annotation {MEMORY}", annotations[MEMORY], parse_memory))
    for setting, resource, parse in (
        (share, HAMI_CORES, _share_from_cores),
        (memory, HAMI_MEMORY, _memory_from_gpumem),
    ):
        total, named = 0, []
        for container in containers:
            limit = _resource(container, resource)
            if limit is None:
                continue
            cname = _text(container.get("name", "?"))
            try:
                total += _count(limit, f"{resource} of container {cname}")
            except ValidationError as error:
                # Only an error where this key is the one used: checked with the others below.
                setting.offers.append(
                    (f"container {cname} limit {resource}", _text(limit), _raise(error))
                )
                continue
            named.append(cname)
        if named:
            where = f"limit {resource}" + (
                f" (containers {' + '.join(named)})"
                if len(named) > 1
                else f" (container {named[0]})"
            )
            setting.offers.append((where, str(total), parse))

    conflicts: list[Conflict] = []
    results = []
    for setting in (pod_class, share, memory):
        found, setting_conflicts = _decide(setting, errors, notes)
        results.append(found)
        conflicts += setting_conflicts
    if not reasons:
        # Not a GPU pod: whatever it says is not used, so it is no error either.
        errors = [e for e in errors if not e.startswith("unknown annotation")]
    qos, qos_from = qos_class(pod)
    phase = _text(_mapping(pod.get("status")).get("phase", ""))
    uid = metadata.get("uid")
    return PodFacts(
        namespace=_text(metadata.get("namespace") or "default"),
        name=_text(metadata.get("name", "")),
        uid=_text(uid) if uid else None,
        qos=qos,
        qos_from=qos_from,
        phase=phase,
        created=_created(pod),
        gpu_reasons=tuple(reasons),
        pod_class=results[0],
        share=results[1],
        memory=results[2],
        conflicts=tuple(conflicts),
        errors=tuple(errors),
        notes=tuple(notes),
        visible_devices=tuple(visible),
        gpu_requests=tuple(gpu_requests),
    )


def _raise(error: ValidationError) -> Callable[[str], PodClass | int | None]:
    def parse(text: str) -> PodClass | int | None:
        raise error

    return parse


def _hami_priority(text: str) -> PodClass:
    found = _HAMI_PRIORITY.get(text.strip())
    if found is None:
        raise ValidationError(
            f"invalid {HAMI_PRIORITY} {text!r}: expected 0 (online) or 1 (offline)"
        )
    return found


def _koordinator(text: str) -> PodClass:
    found = _KOORDINATOR.get(text.strip().upper())
    if found is None:
        raise ValidationError(
            f"invalid {KOORDINATOR_QOS} {text!r}: expected LSE, LSR or LS (online), BE "
            "(offline), SYSTEM or NONE"
        )
    return found


def _render(value: PodClass | int | None, setting: str) -> str:
    if value is None:
        return "none"
    if isinstance(value, PodClass):
        return value.value
    if setting == "memory":
        return format_bytes(value)
    return str(value)


def _decide(setting: _Setting, errors: list[str], notes: list[str]) -> tuple[Found, list[Conflict]]:
    """The first key's value (an error if it is bad), and the keys after it that disagree."""
    chosen: Found | None = None
    bad = False
    conflicts: list[Conflict] = []
    for key, text, parse in setting.offers:
        long = _long(key, text)
        try:
            if long is not None:
                raise ValidationError(long)
            value = parse(text)
        except ValidationError as error:
            if chosen is None:
                errors.append(f"{key}: {error}")
                chosen, bad = Found(setting.default.value, key, text), True
            else:
                notes.append(f"{key}: {error} (ignored: {chosen.key} is used)")
            continue
        if chosen is None:
            chosen = Found(value, key, text)
        elif not bad and value != chosen.value:
            conflicts.append(
                Conflict(
                    setting.name,
                    chosen.key,
                    _render(chosen.value, setting.name),
                    key,
                    _render(value, setting.name),
                )
            )
    return (chosen or setting.default), conflicts


def explain(facts: PodFacts, gpus: Sequence[GpuInfo] = ()) -> dict[str, Any]:
    """The JSON document ``qpolicy kube explain --json`` prints (the text output is drawn from
    it)."""
    tokens = [t for _, value in facts.visible_devices for t in visible_device_tokens(value)]
    indexes, problems = resolve_gpus(tokens, gpus)
    if tokens and not gpus:
        # No node to resolve UUIDs against (explain runs anywhere): indexes are still indexes.
        indexes = sorted(
            {parse_gpu_index(t) for t in tokens if re.fullmatch(r"[0-9]+", t.split("::")[0])}
        )
        problems = [f"{t!r} is resolved on the node" for t in tokens if not t.isdigit()]
    governed = indexes[0] if indexes else None
    refused: list[str] = []
    if not facts.gpu_pod:
        refused.append("not a GPU pod: qpolicy leaves it alone")
    refused += [f"bad value: {e}" for e in facts.errors]
    return {
        "pod": facts.key,
        "uid": facts.uid,
        "gpu_pod": facts.gpu_pod,
        "gpu_reasons": list(facts.gpu_reasons),
        "class": {"value": facts.pod_class.shown(), "from": facts.pod_class.key},
        "share": {"value": facts.share.value, "from": facts.share.key},
        "memory_bytes": {"value": facts.memory.value, "from": facts.memory.key},
        "conflicts": [c.message for c in facts.conflicts],
        "errors": list(facts.errors),
        "notes": list(facts.notes),
        "qos": {"value": facts.qos, "from": facts.qos_from},
        "cgroups": facts.cgroups(),
        "gpus": {
            "visible_devices": [{"container": c, "value": v} for c, v in facts.visible_devices],
            "requested": [{"container": c, "count": n} for c, n in facts.gpu_requests],
            "indexes": indexes,
            "governed_on": governed,
            "unresolved": problems,
        },
        "refused": refused,
    }
