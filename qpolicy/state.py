"""The desired state of a node (GPU policies and pods) and the file that keeps it.

The CLI writes the state, the daemon reads it. :class:`DesiredState` is immutable: every change
makes a new state, and the changes that could make a GPU unplannable are refused when they are made
(:func:`qpolicy.model.check_pods_fit`), not when the daemon next plans.

:class:`StateStore` keeps the state in ``state.json`` (versioned JSON, see :func:`encode_state`).
Updates hold an exclusive lock for the whole read-modify-write, so concurrent CLI calls never lose
each other's changes, and replace the file atomically, so a reader or a crash never sees half a
file. A file this version cannot read is reported and never overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from qpolicy.errors import StateError, ValidationError
from qpolicy.model import (
    GpuConfig,
    GpuPolicy,
    PodClass,
    PodSpec,
    check_pods_fit,
    parse_gpu_index,
    parse_memory,
    parse_period_ms,
    parse_pod_id,
    parse_share,
)
from qpolicy.runtime.atomicfile import write_atomically

SCHEMA_VERSION = 1
STATE_DIR_ENV = "QPOLICY_STATE_DIR"
DEFAULT_STATE_DIR = Path("/var/lib/qpolicy")
STATE_FILE_NAME = "state.json"
LOCK_FILE_NAME = ".state.lock"

_T = TypeVar("_T")
_V = TypeVar("_V")


def default_state_dir() -> Path:
    """``$QPOLICY_STATE_DIR`` if set (and not empty), else ``/var/lib/qpolicy``."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


@dataclass(frozen=True, slots=True)
class DesiredState:
    """What the node should do: the explicitly configured GPUs and the pods, keyed by index / id.

    GPUs that are not configured run the default :class:`GpuConfig` (best-effort). Iteration order
    is by GPU index and by pod id, so everything derived from a state is deterministic.
    """

    gpus: Mapping[int, GpuConfig] = field(default_factory=dict)
    pods: Mapping[str, PodSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for index, gpu in self.gpus.items():
            if gpu.index != index:
                raise ValueError(f"GPU {gpu.index} filed under index {index}")
        for pod_id, pod in self.pods.items():
            if pod.id != pod_id:
                raise ValueError(f"pod {pod.id!r} filed under id {pod_id!r}")
        # Read-only copies: a caller's dict must not be able to change a state after the fact.
        gpus = MappingProxyType(dict(sorted(self.gpus.items())))
        pods = MappingProxyType(dict(sorted(self.pods.items())))
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "pods", pods)

    def gpu(self, index: int) -> GpuConfig:
        """The configuration of GPU ``index``: as configured, else the default."""
        return self.gpus.get(index) or GpuConfig(index)

    def pods_on(self, index: int) -> tuple[PodSpec, ...]:
        """The pods placed on GPU ``index``, by id."""
        return tuple(pod for pod in self.pods.values() if pod.gpu == index)

    def gpu_indices(self) -> list[int]:
        """The GPUs that are configured or have pods, in order."""
        return sorted({*self.gpus, *(pod.gpu for pod in self.pods.values())})

    def with_gpu(self, config: GpuConfig) -> DesiredState:
        """Configure a GPU; raises PlanError if its pods' shares do not fit the new policy."""
        check_pods_fit(config, self.pods_on(config.index))
        return replace(self, gpus={**self.gpus, config.index: config})

    def with_pod(self, pod: PodSpec) -> DesiredState:
        """Add ``pod``, replacing a pod of the same id; raises PlanError if it does not fit."""
        neighbours = [p for p in self.pods_on(pod.gpu) if p.id != pod.id]
        check_pods_fit(self.gpu(pod.gpu), [*neighbours, pod])
        return replace(self, pods={**self.pods, pod.id: pod})

    def without_pod(self, pod_id: str) -> DesiredState:
        if pod_id not in self.pods:
            raise ValidationError(f"no pod {pod_id!r}")
        return replace(self, pods={k: v for k, v in self.pods.items() if k != pod_id})


# --- JSON -----------------------------------------------------------------------------------------


def encode_state(state: DesiredState) -> bytes:
    """The bytes of the state file for ``state``: stable order, one key per line."""
    return (json.dumps(_to_json(state), indent=2) + "\n").encode()


def _to_json(state: DesiredState) -> dict[str, Any]:
    """The JSON document of ``state``::

    {"schema": 1,
     "gpus": {"0": {"policy": "burst-share", "period_ms": 50}},
     "pods": {"/kubepods/x": {"gpu": 0, "class": "online", "share": 30, "memory_bytes": null}}}
    """
    return {
        "schema": SCHEMA_VERSION,
        "gpus": {
            str(index): {"policy": gpu.policy.value, "period_ms": gpu.period_ms}
            for index, gpu in state.gpus.items()
        },
        "pods": {
            pod_id: {
                "gpu": pod.gpu,
                "class": pod.pod_class.value,
                "share": pod.share,
                "memory_bytes": pod.memory_limit,
            }
            for pod_id, pod in state.pods.items()
        },
    }


class _Invalid(Exception):
    """A value in a state document is not acceptable; the message says where and why."""


def decode_state(raw: bytes, source: str) -> DesiredState:
    """Check and convert the bytes of a state file written by :func:`encode_state`.

    Every value goes through the model's parsers. Raises :class:`StateError` naming ``source`` (the
    file) and the bad value.
    """
    try:
        return _decode(_loads(raw))
    except _Invalid as error:
        raise StateError(f"{source}: {error}") from error


def _decode(data: object) -> DesiredState:
    if not isinstance(data, dict):
        raise _Invalid(f"expected a JSON object, found {_json_type(data)}")
    # The version is checked before anything else: a newer file may be laid out differently.
    schema = data.get("schema")
    if type(schema) is int and schema > SCHEMA_VERSION:
        raise _Invalid(
            f"written by a newer qpolicy (schema {schema}); this one reads schema {SCHEMA_VERSION}"
        )
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise _Invalid(f"unknown schema {schema!r}; this qpolicy reads schema {SCHEMA_VERSION}")
    _check_keys(data, "the document", required={"schema", "gpus", "pods"})
    gpus = {}
    for key, value in _object(data["gpus"], "gpus").items():
        where = f"gpus[{json.dumps(key)}]"
        index = _parse(parse_gpu_index, key, where)
        if key != str(index):
            # "1" and "01" would otherwise silently name the same GPU twice.
            raise _Invalid(f"{where}: GPU index {key!r} is not written as a plain number")
        gpus[index] = _decode_gpu(index, _object(value, where), where)
    pods = {}
    for key, value in _object(data["pods"], "pods").items():
        where = f"pods[{json.dumps(key)}]"
        pods[key] = _decode_pod(key, _object(value, where), where)
    return DesiredState(gpus=gpus, pods=pods)


def _decode_gpu(index: int, obj: dict[str, Any], where: str) -> GpuConfig:
    _check_keys(obj, where, required={"policy"}, optional={"period_ms"})
    policy = _parse(GpuPolicy.parse, _typed(obj, "policy", str, where), f"{where}.policy")
    period = obj.get("period_ms")
    if period is None:
        return GpuConfig(index, policy)
    period_ms = _parse(parse_period_ms, _typed(obj, "period_ms", int, where), f"{where}.period_ms")
    return GpuConfig(index, policy, period_ms)


def _decode_pod(pod_id: str, obj: dict[str, Any], where: str) -> PodSpec:
    _check_keys(obj, where, required={"gpu"}, optional={"class", "share", "memory_bytes"})
    _parse(parse_pod_id, pod_id, where)
    gpu = _parse(parse_gpu_index, _typed(obj, "gpu", int, where), f"{where}.gpu")
    pod_class = PodClass.OFFLINE
    if obj.get("class") is not None:
        pod_class = _parse(PodClass.parse, _typed(obj, "class", str, where), f"{where}.class")
    share = None
    if obj.get("share") is not None:
        share = _parse(parse_share, _typed(obj, "share", int, where), f"{where}.share")
    memory = None
    if obj.get("memory_bytes") is not None:
        memory = _parse(
            parse_memory, _typed(obj, "memory_bytes", int, where), f"{where}.memory_bytes"
        )
    return PodSpec(pod_id, gpu, pod_class, share, memory)


def _parse(parser: Callable[[_V], _T], value: _V, where: str) -> _T:
    try:
        return parser(value)
    except ValidationError as error:
        raise _Invalid(f"{where}: {error}") from error


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"{where}: expected a JSON object, found {_json_type(value)}")
    return value


def _typed(obj: dict[str, Any], key: str, kind: type[_V], where: str) -> _V:
    value = obj.get(key)
    # bool is an int to Python but not to a reader of the file: true is no GPU index.
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = "an integer" if kind is int else "a string"
        raise _Invalid(f"{where}.{key}: expected {expected}, found {_json_type(value)} {value!r}")
    return value


def _check_keys(
    obj: dict[str, Any],
    where: str,
    *,
    required: AbstractSet[str],
    optional: AbstractSet[str] = frozenset(),
) -> None:
    missing = sorted(required - obj.keys())
    if missing:
        raise _Invalid(f"{where}: missing {', '.join(map(repr, missing))}")
    # A misspelt key ("shares") must not be silently ignored: the pod would lose its share.
    unknown = sorted(obj.keys() - required - optional)
    if unknown:
        raise _Invalid(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys; a hand-edited file listing one pod twice is
    # more likely a mistake than a wish, so it is refused rather than half applied.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Invalid(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def _loads(raw: bytes) -> object:
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except UnicodeDecodeError as error:
        raise _Invalid(f"not UTF-8 text ({error.reason} at byte {error.start})") from error
    except (ValueError, RecursionError) as error:
        raise _Invalid(f"not valid JSON ({error})") from error


# --- the file -------------------------------------------------------------------------------------


class StateStore:
    """The state file ``<directory>/state.json`` and its lock ``<directory>/.state.lock``."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_state_dir()

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE_NAME

    @property
    def lock_path(self) -> Path:
        return self.directory / LOCK_FILE_NAME

    def load(self) -> DesiredState:
        """The current state; empty if there is no state file yet.

        Reads need no lock: the file is only ever replaced whole, never rewritten in place.
        """
        return self._read()

    def update(self, change: Callable[[DesiredState], DesiredState]) -> DesiredState:
        """Apply ``change`` to the current state under an exclusive lock and save the result.

        If ``change`` raises, or the current file cannot be read, nothing is written.
        """
        with self._locked():
            new = change(self._read())
            try:
                self._write(encode_state(new))
            except OSError as error:
                raise self._access_error("write", self.path, error) from error
            return new

    def _read(self) -> DesiredState:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return DesiredState()
        except OSError as error:
            raise self._access_error("read", self.path, error, untouched=True) from error
        try:
            return decode_state(raw, f"state file {self.path}")
        except StateError as error:
            raise StateError(f"{error} (the file was left untouched)") from error

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise self._access_error("write", self.directory, error) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            # Closing the only descriptor of the open file releases the lock.
            os.close(fd)

    def _write(self, data: bytes) -> None:
        write_atomically(self.path, data, prefix=".state.", durable=True)

    @staticmethod
    def _access_error(
        verb: str, path: Path, error: OSError, *, untouched: bool = False
    ) -> StateError:
        reason = error.strerror or str(error)
        note = "; the file was left untouched" if untouched else ""
        return StateError(
            f"cannot {verb} {path}: {reason}{note} (run as root, or set {STATE_DIR_ENV} "
            "to a directory you can read and write)"
        )
