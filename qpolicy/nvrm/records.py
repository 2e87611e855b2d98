"""One syscall on an NVIDIA device file, as a trace line or a probe event.

The JSON-lines trace format (docs/gpu-measurements.md §1): ``kind`` open|ioctl|mmap, ``ts`` (ns),
``tid``, ``cmd`` (ioctl request; for mmap the fd), ``a1`` (ioctl fd; open flags; mmap length),
``a2`` (ioctl argument pointer; mmap prot | flags << 8), ``a3`` (inner params pointer of
RM_ALLOC/RM_CONTROL; mmap offset), ``ret``, ``dur_ns``, ``p`` (hex: the first 64 bytes of the
ioctl argument after the call), ``q`` (hex: the first 96 bytes of the inner params after the
call), ``s`` (open path). The probe adds ``pid`` and ``cgroup`` and two kinds of its own:
``close`` (``a1`` = fd) and ``exit``. A trace without ``pid`` is one process.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

KINDS = frozenset({"open", "ioctl", "mmap", "close", "exit"})
P_BYTES = 64
Q_BYTES = 96


class RecordError(ValueError):
    """A trace line that is not a record; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Record:
    kind: str
    ts: int
    tid: int
    cmd: int = 0
    a1: int = 0
    a2: int = 0
    a3: int = 0
    ret: int = 0
    dur_ns: int = 0
    p: bytes = b""
    q: bytes = b""
    s: str = ""
    pid: int | None = None
    cgroup: int | None = None

    @property
    def fd(self) -> int:
        """The fd the record is about (ioctl and close: a1; mmap: cmd; open: the result)."""
        if self.kind == "mmap":
            return self.cmd
        if self.kind == "open":
            return self.ret
        return self.a1

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "ts": self.ts,
            "tid": self.tid,
            "cmd": self.cmd,
            "a1": self.a1,
            "a2": self.a2,
            "a3": self.a3,
            "ret": self.ret,
            "dur_ns": self.dur_ns,
            "p": self.p.hex(),
            "q": self.q.hex(),
            "s": self.s,
        }
        if self.pid is not None:
            data["pid"] = self.pid
        if self.cgroup is not None:
            data["cgroup"] = self.cgroup
        return data


_INT_FIELDS = ("ts", "tid", "cmd", "a1", "a2", "a3", "ret", "dur_ns")


def _int(data: dict[str, Any], key: str, default: int | None) -> int:
    value = data.get(key, default)
    if value is None:
        raise RecordError(f"missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{key!r} is not an integer: {value!r}")
    return value


def _hex(data: dict[str, Any], key: str, limit: int) -> bytes:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise RecordError(f"{key!r} is not a hex string: {value!r}")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise RecordError(f"{key!r} is not valid hex") from None
    return raw[:limit]


def parse_record(line: str) -> Record:
    """Parse one trace line; raises RecordError for anything that is not a whole record."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise RecordError(f"not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    kind = data.get("kind")
    if kind not in KINDS:
        raise RecordError(f"unknown kind {kind!r}")
    ints = {key: _int(data, key, None if key in ("ts", "tid") else 0) for key in _INT_FIELDS}
    path = data.get("s", "")
    if not isinstance(path, str):
        raise RecordError(f"'s' is not a string: {path!r}")
    pid = data.get("pid")
    cgroup = data.get("cgroup")
    for key, value in (("pid", pid), ("cgroup", cgroup)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RecordError(f"{key!r} is not an integer: {value!r}")
    return Record(
        kind=kind,
        p=_hex(data, "p", P_BYTES),
        q=_hex(data, "q", Q_BYTES),
        s=path,
        pid=pid,
        cgroup=cgroup,
        **ints,
    )


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    reason: str


def read_records(lines: Iterable[str]) -> Iterator[Record | BadLine]:
    """Records of a JSON-lines trace, with a BadLine (never an exception) for each bad line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield parse_record(line)
        except RecordError as error:
            yield BadLine(number, str(error))
