"""``qpolicy trace`` live: probe records into the object tracker, per-cgroup rows per interval.

The probe's kernel counters give the rates (ioctls, launches); the tracker, fed with the streamed
outcomes, gives what each cgroup holds now (TSGs, channels, device memory). Both are keyed by the
cgroup v2 id; rows show its path.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from qpolicy.nvrm.abi import Node
from qpolicy.nvrm.tracker import Tracker
from qpolicy.telemetry.cgroups import CgroupMap, within
from qpolicy.telemetry.probe import CgroupCounters
from qpolicy.telemetry.wire import ProbeRecord

MAX_POLL_S = 0.2


class Source(Protocol):
    """What the live view needs from the probe (a fake in unit tests)."""

    @property
    def lost(self) -> int: ...

    def poll(self, timeout_ms: int = 0) -> list[ProbeRecord]: ...

    def counters(self) -> dict[int, CgroupCounters]: ...

    def node_of(self, major: int, minor: int) -> Node: ...


@dataclass(frozen=True, slots=True)
class CgroupRow:
    cgroup: str
    id: int
    processes: int
    ioctls: int
    ioctls_per_s: float
    launches: int
    launches_per_s: float
    tsgs: int
    channels: int
    device_bytes: int
    opens: int
    mmaps: int
    escapes: Mapping[str, int]
    controls: Mapping[str, int]
    allocs: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "cgroup": self.cgroup,
            "id": self.id,
            "processes": self.processes,
            "ioctls": self.ioctls,
            "ioctls_per_s": round(self.ioctls_per_s, 3),
            "launches": self.launches,
            "launches_per_s": round(self.launches_per_s, 3),
            "tsgs": self.tsgs,
            "channels": self.channels,
            "device_bytes": self.device_bytes,
            "opens": self.opens,
            "mmaps": self.mmaps,
            "escapes": dict(self.escapes),
            "controls": dict(self.controls),
            "allocs": dict(self.allocs),
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    ts: float  # wall clock, seconds
    interval_s: float
    records: int  # streamed records fed to the tracker during the interval
    lost: int  # events the kernel could not stream, since the probe started
    rows: tuple[CgroupRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": round(self.ts, 3),
            "interval_s": round(self.interval_s, 3),
            "records": self.records,
            "lost_events": self.lost,
            "cgroups": [row.to_json() for row in self.rows],
        }


@dataclass(slots=True)
class _Held:
    processes: int = 0
    tsgs: int = 0
    channels: int = 0
    device_bytes: int = 0


class LiveView:
    """Tracker + counters -> rows; ``cgroup`` keeps that cgroup and its descendants."""

    def __init__(
        self,
        source: Source,
        cgroups: CgroupMap,
        cgroup: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.cgroups = cgroups
        self.cgroup = cgroup
        self.tracker = Tracker()
        self._clock = clock
        self._last_at = clock()
        self._last: dict[int, CgroupCounters] = {}
        self._records = 0

    def feed(self, records: Iterable[ProbeRecord]) -> None:
        for record in records:
            self._records += 1
            node = (
                None if record.kind == "exit" else self.source.node_of(record.major, record.minor)
            )
            self.tracker.feed(record, node=node)

    def _held(self) -> dict[int, _Held]:
        held: dict[int, _Held] = {}
        for pid, proc in self.tracker.processes.items():
            if proc.cgroup is None:
                continue
            summary = self.tracker.summary(pid)
            entry = held.setdefault(proc.cgroup, _Held())
            entry.processes += 1
            entry.tsgs += summary.tsgs
            entry.channels += summary.channel_count
            entry.device_bytes += summary.device_bytes
        return held

    def snapshot(self) -> Snapshot:
        now = self._clock()
        elapsed = max(now - self._last_at, 1e-9)
        counters = self.source.counters()
        held = self._held()
        rows = []
        for cgid in sorted(set(counters) | set(held)):
            path = self.cgroups.path_of(cgid)
            if self.cgroup is not None and (path is None or not within(path, self.cgroup)):
                continue
            now_counts = counters.get(cgid, CgroupCounters(cgid))
            before = self._last.get(cgid, CgroupCounters(cgid))
            have = held.get(cgid, _Held())
            rows.append(
                CgroupRow(
                    cgroup=path if path is not None else f"cgroup#{cgid}",
                    id=cgid,
                    processes=have.processes,
                    ioctls=now_counts.ioctls,
                    ioctls_per_s=(now_counts.ioctls - before.ioctls) / elapsed,
                    launches=now_counts.launches,
                    launches_per_s=(now_counts.launches - before.launches) / elapsed,
                    tsgs=have.tsgs,
                    channels=have.channels,
                    device_bytes=have.device_bytes,
                    opens=now_counts.opens,
                    mmaps=now_counts.mmaps,
                    escapes=now_counts.escapes,
                    controls=now_counts.controls,
                    allocs=now_counts.allocs,
                )
            )
        rows.sort(key=lambda row: row.cgroup)
        snap = Snapshot(time.time(), elapsed, self._records, self.source.lost, tuple(rows))
        self._last = counters
        self._last_at = now
        self._records = 0
        return snap


class StopRequest:
    """Whether a stop was asked for (by a signal): :func:`run` looks between polls."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    def ask(self, signum: int, _frame: FrameType | None = None) -> None:
        self.signum = signum


@contextlib.contextmanager
def stop_on(*signums: int) -> Iterator[StopRequest]:
    """While inside, each of ``signums`` (SIGINT: Ctrl-C) only sets the yielded request.

    Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be.
    In a live trace that is often inside bcc's buffer callback, called from C by the ring buffer
    poll; ctypes prints an exception raised there ("Exception ignored on calling ctypes callback
    function") and drops it, and the Ctrl-C is lost: the trace went on until killed. Raised
    elsewhere it cuts short the last snapshot, the probe's load or its cleanup. A flag has no
    such moments: the poll returns at the signal (EINTR) or within ``MAX_POLL_S``, :func:`run`
    sees the flag, emits a last snapshot and returns, and the probe is detached.

    The previous handlers come back when the block ends, unless one of the signals came: then
    the caller is on its way out because of it and the signals are ignored from there on, so that
    a second Ctrl-C cannot turn a clean stop into an abort, nor kill the process as it exits
    (Python puts the default action back for its last moments). Outside the main thread (where
    handlers cannot be set) nothing is installed, and KeyboardInterrupt still stops :func:`run`.
    """
    request = StopRequest()
    previous: dict[int, Any] = {}
    try:
        try:
            for signum in signums:
                previous[signum] = signal.signal(signum, request.ask)
        except ValueError:  # not the main thread
            pass
        yield request
    finally:
        for signum, handler in previous.items():
            if request():
                signal.signal(signum, signal.SIG_IGN)
            else:
                # None: a handler not set from Python; the default is the nearest to it.
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def run(
    view: LiveView,
    interval_s: float,
    duration_s: float | None,
    emit: Callable[[Snapshot], None],
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Poll the probe and emit a snapshot every ``interval_s`` until ``duration_s`` has passed
    (never, if None), ``stop()`` holds (checked at least every ``MAX_POLL_S``) or Ctrl-C; the
    last, possibly shorter, interval is emitted too."""
    start = clock()
    end = None if duration_s is None else start + duration_s
    next_at = start + interval_s
    try:
        while True:
            now = clock()
            done = stop() or (end is not None and now >= end)
            if now >= next_at or done:
                view.feed(view.source.poll(0))
                emit(view.snapshot())
                next_at += interval_s
                if next_at <= clock():
                    # A slow emit (a stalled terminal) skips intervals rather than bunching them.
                    next_at = clock() + interval_s
            if done:
                return
            wait = min(next_at, end if end is not None else next_at) - clock()
            timeout_ms = int(min(max(wait, 0.0), MAX_POLL_S) * 1000)
            view.feed(view.source.poll(timeout_ms))
    except KeyboardInterrupt:
        # Without stop_on(): Python's handler raised it. The same last snapshot.
        view.feed(view.source.poll(0))
        emit(view.snapshot())
