"""The vocabulary of qpolicy: GPU policies, pod classes, pod specs and their validation.

Spellings follow ARCHITECTURE.md (and Tencent qGPU): ``best-effort``, ``fixed-share`` and
``burst-share`` with the short forms ``be``/``fs``/``bs``, classes ``online``/``offline``, shares in
integer percent.
Every parser raises :class:`ValidationError` with a message that quotes the offending value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from qpolicy.errors import PlanError, ValidationError

# /dev/nvidia0 .. /dev/nvidia247 (NV_MINOR_DEVICE_NUMBER_REGULAR_MAX in nvidia.ko).
MAX_GPU_INDEX = 247
DEFAULT_PERIOD_MS = 50
# A switch between two tenants costs ~1.2 ms of channel controls (docs/gpu-measurements.md §2):
# below 5 ms periods the switches would eat most of the GPU, above a second reaction gets too slow.
MIN_PERIOD_MS = 5
MAX_PERIOD_MS = 1000
MIN_SHARE = 1
MAX_SHARE = 100
MAX_POD_ID_LEN = 4096


class GpuPolicy(StrEnum):
    BEST_EFFORT = "best-effort"
    FIXED_SHARE = "fixed-share"
    BURST_SHARE = "burst-share"

    @property
    def short(self) -> str:
        return _POLICY_SHORT[self]

    @property
    def needs_shares(self) -> bool:
        """Fixed- and burst-share are defined by shares; best-effort ignores them."""
        return self is not GpuPolicy.BEST_EFFORT

    @property
    def work_conserving(self) -> bool:
        """Whether idle time is handed to busy pods (everything but fixed-share)."""
        return self is not GpuPolicy.FIXED_SHARE

    @classmethod
    def parse(cls, text: str) -> GpuPolicy:
        """Any spelling users bring: ``burst``, ``bs``, ``Burst-Share``, ``BURST_SHARE``...

        Case, hyphens, underscores and spaces do not matter; qGPU's names and short forms, the
        first word alone (``best``, ``fixed``, ``burst``) and qgpu.ko's enum names all work.
        """
        key = re.sub(r"[-_\s]", "", text).lower()
        policy = _POLICY_ALIASES.get(key)
        if policy is None:
            raise ValidationError(
                f"invalid policy {text!r}: expected best-effort (be, best), fixed-share (fs, "
                "fixed) or burst-share (bs, burst)"
            )
        return policy


_POLICY_SHORT = {
    GpuPolicy.BEST_EFFORT: "be",
    GpuPolicy.FIXED_SHARE: "fs",
    GpuPolicy.BURST_SHARE: "bs",
}
_POLICY_ALIASES = {
    alias: policy
    for policy in GpuPolicy
    for alias in (
        policy.value.replace("-", ""),  # besteffort, fixedshare, burstshare
        policy.value.split("-")[0],  # best, fixed, burst
        policy.short,
    )
}


class PodClass(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"

    @classmethod
    def parse(cls, text: str) -> PodClass:
        key = text.strip().lower()
        for pod_class in cls:
            if key == pod_class.value:
                return pod_class
        raise ValidationError(f"invalid class {text!r}: expected online or offline")


def _parse_int(text: str | int, what: str) -> int:
    if isinstance(text, bool):
        raise ValidationError(f"invalid {what} {text!r}: expected an integer")
    if isinstance(text, int):
        return text
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", stripped):
        raise ValidationError(f"invalid {what} {text[:64]!r}: expected an integer")
    try:
        return int(stripped)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise ValidationError(f"invalid {what} {text[:32]!r}...: out of range") from None


def parse_gpu_index(text: str | int) -> int:
    index = _parse_int(text, "GPU index")
    if not 0 <= index <= MAX_GPU_INDEX:
        raise ValidationError(f"invalid GPU index {text!r}: must be from 0 to {MAX_GPU_INDEX}")
    return index


def parse_share(text: str | int) -> int:
    share = _parse_int(text, "share")
    if not MIN_SHARE <= share <= MAX_SHARE:
        raise ValidationError(
            f"invalid share {text!r}: must be an integer percent from {MIN_SHARE} to {MAX_SHARE}"
        )
    return share


def parse_period_ms(text: str | int) -> int:
    period = _parse_int(text, "period")
    if not MIN_PERIOD_MS <= period <= MAX_PERIOD_MS:
        raise ValidationError(
            f"invalid period {text!r} ms: must be from {MIN_PERIOD_MS} to {MAX_PERIOD_MS} ms"
        )
    return period


# Kubernetes quantity suffixes, case as Kubernetes spells them (resource.Quantity; milli, "m", is
# left out: it is never a byte count), and the byte-unit spellings people write on the command
# line (GiB, GB), in any case.
QUANTITY_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_MEMORY_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*")
MAX_MEMORY_BYTES = 2**63 - 1
# Decimal places past a number's own digits, either way, beyond which no value qpolicy takes can
# lie (2**63 has 19 digits; Kubernetes' smallest unit is 10**-9).
_EXPONENT_SLACK = 40


def exact_decimal(mantissa: str, exponent: str | None) -> Fraction:
    """``mantissa`` (digits with an optional fraction) times ten to ``exponent``, exactly.

    Values come from tenants (cgroup attributes, pod annotations): "1e100000000" built exactly
    takes minutes and gigabytes, on the daemon's loop thread. An exponent past the mantissa's
    own length by more than ``_EXPONENT_SLACK`` cannot give a value any parser here takes, so it
    is refused (ValueError) before the number is built."""
    power = int(exponent) if exponent else 0
    if abs(power) > len(mantissa) + _EXPONENT_SLACK:
        raise ValueError(f"exponent {power} out of range")
    return Fraction(mantissa) * Fraction(10) ** power


def _memory_unit(text: str, suffix: str) -> int:
    unit = QUANTITY_SUFFIXES.get(suffix) or _BYTE_UNITS.get(suffix.lower())
    if unit is not None:
        return unit
    if suffix == "m":
        hint = "'m' is milli in Kubernetes quantities; write Mi (2^20) or M (10^6)"
    elif suffix.lower() in ("m", "g", "t", "p", "ki", "mi", "gi", "ti", "pi", "k"):
        hint = f"quantity suffixes are case-sensitive: {suffix[0].upper()}{suffix[1:]}"
    else:
        hint = "expected bytes or a Kubernetes quantity such as 8Gi, 8G, 512Mi or 1e9"
    raise ValidationError(f"invalid memory limit {text!r}: {hint}")


def parse_memory(text: str | int) -> int:
    """A device-memory limit in bytes: a Kubernetes quantity (``8Gi``, ``8G``, ``512Mi``,
    ``1e9``), a byte-unit spelling (``8GiB``, ``16GB``) or plain bytes. Fractions are fine where
    they make whole bytes (``1.5Gi``)."""
    if isinstance(text, bool):
        raise ValidationError(f"invalid memory limit {text!r}")
    if isinstance(text, int):
        value = text
    else:
        match = _MEMORY_RE.fullmatch(text)
        if match is None:
            raise ValidationError(
                f"invalid memory limit {text!r}: expected bytes or a Kubernetes quantity such as "
                "8Gi, 8G, 512Mi or 1e9"
            )
        try:
            number = exact_decimal(match.group(1), match.group(2))
        except ValueError:
            raise ValidationError(
                f"invalid memory limit {text[:64]!r}: must be from 1 byte to {MAX_MEMORY_BYTES} "
                "bytes"
            ) from None
        exact = number * _memory_unit(text, match.group(3))
        if exact.denominator != 1:
            raise ValidationError(f"invalid memory limit {text!r}: not a whole number of bytes")
        value = int(exact)
    if not 1 <= value <= MAX_MEMORY_BYTES:
        raise ValidationError(
            f"invalid memory limit {text!r}: must be from 1 byte to {MAX_MEMORY_BYTES} bytes"
        )
    return value


def format_bytes(value: int) -> str:
    """Render a byte count the way users write limits: ``8GiB`` when exact, else ``78.0MiB``."""
    for suffix, unit in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= unit:
            if value % unit == 0:
                return f"{value // unit}{suffix}"
            return f"{value / unit:.1f}{suffix}"
    return f"{value}B"


# A Kubernetes pod: namespace (a DNS-1123 label) / name (a DNS-1123 subdomain).
_KUBE_POD_RE = re.compile(
    r"(?P<ns>[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)/(?P<name>[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)"
)
# A pod of a simulated scenario: a plain name.
_POD_NAME_RE = re.compile(r"[a-zA-Z0-9](?:[-a-zA-Z0-9._]*[a-zA-Z0-9])?")
MAX_KUBE_NAME_LEN = 253


class PodIdKind(StrEnum):
    """What a pod id names, and so what can enforce it."""

    CGROUP = "cgroup"  # /kubepods.slice/...: the cgroup and everything below it
    KUBERNETES = "kubernetes"  # namespace/name: a Kubernetes pod, found through the API server
    NAME = "name"  # a pod of a simulated scenario


def pod_id_kind(pod_id: str) -> PodIdKind:
    """The kind of an id :func:`parse_pod_id` accepted."""
    if pod_id.startswith("/"):
        return PodIdKind.CGROUP
    return PodIdKind.KUBERNETES if "/" in pod_id else PodIdKind.NAME


def parse_pod_id(text: str) -> str:
    """A pod is named by its cgroup v2 path, as a Kubernetes pod, or by a simulated pod's name.

    * ``/kubepods.slice/...``: a cgroup path, absolute and normalised so that one cgroup has one
      spelling; the pod is the cgroup and everything below it;
    * ``ml/trainer-0``: a Kubernetes pod (namespace/name), which the daemon finds through the API
      server when it runs with ``--kubernetes``;
    * ``trainer-0``: a pod of a simulated scenario.

    A path written without its leading ``/`` (``kubepods.slice/x``) is refused with a hint rather
    than taken for a Kubernetes name it cannot be.
    """
    if not text or len(text) > MAX_POD_ID_LEN:
        raise ValidationError(f"invalid pod id {text!r}: must be 1 to {MAX_POD_ID_LEN} characters")
    if text.startswith("/"):
        bad = any(part in ("", ".", "..") for part in text.split("/")[1:])
        if bad or not text.isprintable() or any(c.isspace() for c in text):
            raise ValidationError(
                f"invalid pod id {text!r}: a cgroup path must be absolute and normalised "
                "(no empty, '.' or '..' components, no whitespace; not the root cgroup)"
            )
        return text
    looks_like_path = text.endswith((".slice", ".scope")) or (
        "/" in text and text.split("/", 1)[0].endswith((".slice", ".scope"))
    )
    if looks_like_path or text.count("/") > 1:
        hint = f" (did you mean '/{text}'?)" if _is_clean_path("/" + text) else ""
        raise ValidationError(
            f"invalid pod id {text!r}: a cgroup path must start with '/'{hint}; a Kubernetes pod "
            "is written namespace/name"
        )
    if "/" in text:
        match = _KUBE_POD_RE.fullmatch(text)
        if match is None or len(match["name"]) > MAX_KUBE_NAME_LEN:
            raise ValidationError(
                f"invalid pod id {text!r}: a Kubernetes pod is namespace/name in lowercase "
                "letters, digits and '-' (the name may also hold '.'), like 'ml/trainer-0'; a "
                "cgroup path starts with '/'"
            )
        return text
    if not _POD_NAME_RE.fullmatch(text) or len(text) > MAX_KUBE_NAME_LEN:
        raise ValidationError(
            f"invalid pod id {text!r}: expected a cgroup path starting with '/', a Kubernetes "
            "pod as namespace/name, or a simulated pod's name like 'trainer-0'"
        )
    return text


def _is_clean_path(path: str) -> bool:
    parts = path.split("/")[1:]
    return all(p not in ("", ".", "..") and p.isprintable() and " " not in p for p in parts)


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """The policy of one physical GPU."""

    index: int
    policy: GpuPolicy = GpuPolicy.BEST_EFFORT
    period_ms: int = DEFAULT_PERIOD_MS

    def __post_init__(self) -> None:
        parse_gpu_index(self.index)
        parse_period_ms(self.period_ms)

    @property
    def period_us(self) -> int:
        return self.period_ms * 1000


@dataclass(frozen=True, slots=True)
class PodSpec:
    """The desired treatment of one pod (a cgroup, or a named pod resolved to cgroups)."""

    id: str
    gpu: int
    pod_class: PodClass = PodClass.OFFLINE
    share: int | None = None
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        parse_pod_id(self.id)
        parse_gpu_index(self.gpu)
        if self.share is not None:
            parse_share(self.share)
        if self.memory_limit is not None:
            parse_memory(self.memory_limit)


class FitProblem(StrEnum):
    """Why pods do not fit on a GPU (a short code for metrics; the message says more)."""

    NO_SHARE = "no-share"
    OVERSUBSCRIBED = "oversubscribed"


def fit_problem(gpu: GpuConfig, pods: Iterable[PodSpec]) -> tuple[FitProblem, str] | None:
    """Why ``pods`` cannot all be given their shares on ``gpu``, or None if they can.

    Under fixed-share a share is a cap and under burst-share a guarantee; either way the shares on
    one GPU must fit in 100 %, and every pod needs one. Best-effort accepts anything.
    """
    if not gpu.policy.needs_shares:
        return None
    on_gpu = [p for p in pods if p.gpu == gpu.index]
    missing = sorted(p.id for p in on_gpu if p.share is None)
    if missing:
        return FitProblem.NO_SHARE, (
            f"GPU {gpu.index} is {gpu.policy.value} but pod(s) {', '.join(missing)} have no share"
        )
    total = sum(p.share or 0 for p in on_gpu)
    if total > MAX_SHARE:
        listing = ", ".join(f"{p.id}={p.share}" for p in sorted(on_gpu, key=lambda p: p.id))
        return FitProblem.OVERSUBSCRIBED, (
            f"shares on GPU {gpu.index} ({gpu.policy.value}) sum to {total} > 100: {listing}"
        )
    return None


def check_pods_fit(gpu: GpuConfig, pods: Iterable[PodSpec]) -> None:
    """Raise PlanError unless ``pods`` can all be given their shares on ``gpu``."""
    problem = fit_problem(gpu, pods)
    if problem is not None:
        raise PlanError(problem[1])
