"""Simulation scenarios: one GPU, its policy, and pods with a workload each (YAML).

Example::

    gpu: {policy: burst-share, period_ms: 50}   # period optional
    duration_s: 20
    pods:
      - name: infer
        class: online                # default offline
        share: 30                    # percent; optional under best-effort
        memory: 8GiB                 # optional device memory limit
        load: {kind: requests, rate_hz: 50, kernels: 1, kernel_ms: 0.3}   # poisson: true optional
        active: [[0, 20]]            # optional windows [start_s, end_s]
      - name: train
        share: 70
        load: {kind: saturate, kernel_ms: 2, sync_every: 8}

Unknown keys are errors, so a typo never silently changes a scenario.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from qpolicy.errors import ValidationError
from qpolicy.model import (
    DEFAULT_PERIOD_MS,
    GpuConfig,
    GpuPolicy,
    PodClass,
    PodSpec,
    check_pods_fit,
    parse_memory,
    parse_period_ms,
    parse_pod_id,
    parse_share,
)

MAX_DURATION_S = 3600.0
MAX_PODS = 64

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SaturateLoad:
    kernel_ms: float
    sync_every: int = 8


@dataclass(frozen=True, slots=True)
class RequestsLoad:
    rate_hz: float
    kernel_ms: float
    kernels: int = 1
    poisson: bool = False


Load = SaturateLoad | RequestsLoad


@dataclass(frozen=True, slots=True)
class ScenarioPod:
    name: str
    pod_class: PodClass
    share: int | None
    load: Load
    active: tuple[tuple[float, float], ...]
    memory_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    gpu: GpuConfig
    duration_s: float
    pods: tuple[ScenarioPod, ...]

    def pod_specs(self) -> list[PodSpec]:
        return [
            PodSpec(
                id=p.name,
                gpu=self.gpu.index,
                pod_class=p.pod_class,
                share=p.share,
                memory_limit=p.memory_limit,
            )
            for p in self.pods
        ]


class _Path:
    """Where in the document a value sits, for error messages (``pods[1].load.kernel_ms``)."""

    def __init__(self, source: str, parts: tuple[str, ...] = ()) -> None:
        self.source = source
        self.parts = parts

    def __truediv__(self, part: str | int) -> _Path:
        text = f"[{part}]" if isinstance(part, int) else part
        return _Path(self.source, (*self.parts, text))

    def error(self, message: str) -> ValidationError:
        where = ".".join(self.parts).replace(".[", "[")
        return ValidationError(f"{self.source}: {where or 'top level'}: {message}")

    def wrap(self, parse: Callable[[Any], T], value: Any) -> T:
        try:
            return parse(value)
        except ValidationError as exc:
            raise self.error(str(exc)) from None


def _mapping(value: Any, path: _Path, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise path.error(f"expected a mapping, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise path.error(
            f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    missing = sorted(required - set(value))
    if missing:
        raise path.error(f"missing key(s) {', '.join(missing)}")
    return dict(value)


def _number(value: Any, path: _Path, low: float, high: float, *, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise path.error(f"expected a number, got {value!r}")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bound = "(" if low_open else "["
        raise path.error(f"{value!r} is out of range {bound}{low:g}, {high:g}]")
    return float(value)


def _integer(value: Any, path: _Path, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise path.error(f"expected an integer, got {value!r}")
    if not low <= value <= high:
        raise path.error(f"{value!r} is out of range [{low}, {high}]")
    return value


def _load(value: Any, path: _Path) -> Load:
    kinds = {"saturate", "requests"}
    if not isinstance(value, Mapping) or value.get("kind") not in kinds:
        kind = value.get("kind") if isinstance(value, Mapping) else value
        raise (path / "kind").error(f"expected saturate or requests, got {kind!r}")
    kernel_ms_range = (0.0, 1000.0)
    if value["kind"] == "saturate":
        data = _mapping(value, path, {"kind", "kernel_ms", "sync_every"}, {"kernel_ms"})
        return SaturateLoad(
            kernel_ms=_number(data["kernel_ms"], path / "kernel_ms", *kernel_ms_range),
            sync_every=_integer(data.get("sync_every", 8), path / "sync_every", 1, 100_000),
        )
    data = _mapping(
        value,
        path,
        {"kind", "rate_hz", "kernels", "kernel_ms", "poisson"},
        {"rate_hz", "kernel_ms"},
    )
    poisson = data.get("poisson", False)
    if not isinstance(poisson, bool):
        raise (path / "poisson").error(f"expected true or false, got {poisson!r}")
    return RequestsLoad(
        rate_hz=_number(data["rate_hz"], path / "rate_hz", 0.0, 100_000.0),
        kernel_ms=_number(data["kernel_ms"], path / "kernel_ms", *kernel_ms_range),
        kernels=_integer(data.get("kernels", 1), path / "kernels", 1, 10_000),
        poisson=poisson,
    )


def _active(value: Any, path: _Path, duration: float) -> tuple[tuple[float, float], ...]:
    if value is None:
        return ((0.0, duration),)
    if not isinstance(value, list) or not value:
        raise path.error(f"expected a list of [start_s, end_s] windows, got {value!r}")
    windows: list[tuple[float, float]] = []
    for index, window in enumerate(value):
        where = path / index
        if not isinstance(window, list) or len(window) != 2:
            raise where.error(f"expected [start_s, end_s], got {window!r}")
        start = _number(window[0], where, 0.0, duration, low_open=False)
        end = _number(window[1], where, 0.0, duration, low_open=False)
        if end <= start:
            raise where.error(f"window [{start:g}, {end:g}] ends before it starts")
        if windows and start < windows[-1][1]:
            raise where.error("windows must be in order and must not overlap")
        windows.append((start, end))
    return tuple(windows)


def parse_scenario(document: Any, source: str = "scenario") -> Scenario:
    root = _Path(source)
    data = _mapping(document, root, {"gpu", "duration_s", "pods"}, {"duration_s", "pods"})
    gpu_data = _mapping(data.get("gpu", {}), root / "gpu", {"policy", "period_ms"}, set())
    policy = (root / "gpu" / "policy").wrap(GpuPolicy.parse, str(gpu_data.get("policy", "be")))
    period = (root / "gpu" / "period_ms").wrap(
        parse_period_ms, gpu_data.get("period_ms", DEFAULT_PERIOD_MS)
    )
    gpu = GpuConfig(index=0, policy=policy, period_ms=period)
    duration = _number(data["duration_s"], root / "duration_s", 0.0, MAX_DURATION_S)

    pods_data = data["pods"]
    if not isinstance(pods_data, list) or not 1 <= len(pods_data) <= MAX_PODS:
        raise (root / "pods").error(f"expected a list of 1 to {MAX_PODS} pods")
    pods: list[ScenarioPod] = []
    for index, item in enumerate(pods_data):
        path = root / "pods" / index
        pod = _mapping(
            item, path, {"name", "class", "share", "memory", "load", "active"}, {"name", "load"}
        )
        name = (path / "name").wrap(parse_pod_id, str(pod["name"]))
        if any(p.name == name for p in pods):
            raise (path / "name").error(f"duplicate pod name {name!r}")
        share = pod.get("share")
        memory = pod.get("memory")
        pods.append(
            ScenarioPod(
                name=name,
                pod_class=(path / "class").wrap(PodClass.parse, str(pod.get("class", "offline"))),
                share=None if share is None else (path / "share").wrap(parse_share, share),
                load=_load(pod["load"], path / "load"),
                active=_active(pod.get("active"), path / "active", duration),
                memory_limit=None
                if memory is None
                else (path / "memory").wrap(parse_memory, memory),
            )
        )
    scenario = Scenario(gpu=gpu, duration_s=duration, pods=tuple(pods))
    (root / "pods").wrap(lambda specs: check_pods_fit(gpu, specs), scenario.pod_specs())
    return scenario


def load_scenario(path: Path) -> Scenario:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot read scenario {str(path)!r}: {exc.strerror}") from None
    return parse_scenario_text(text, str(path))


def parse_scenario_text(text: str, source: str) -> Scenario:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValidationError(f"{source}: not valid YAML{where}") from None
    return parse_scenario(document, source)
