"""The eBPF probe as a daemon data source: what each cgroup's processes do with the driver.

Counters (ioctls by escape, latency, launches) come from the probe's kernel maps; the objects a
cgroup holds (TSGs, channels, device memory) from the tracker its RM_ALLOC/RM_FREE outcomes feed;
which GPUs a cgroup uses from the minors of the /dev/nvidiaN files its processes opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from qpolicy.nvrm.abi import Node
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.live import LiveView, Source
from qpolicy.telemetry.view import DriverActivity, Histogram


@dataclass(frozen=True, slots=True)
class CgroupActivity:
    path: str
    activity: DriverActivity
    gpus: frozenset[int] = field(default_factory=frozenset)


def merge(a: DriverActivity, b: DriverActivity) -> DriverActivity:
    ioctls = dict(a.ioctls)
    for name, count in b.ioctls.items():
        ioctls[name] = ioctls.get(name, 0) + count
    return DriverActivity(
        ioctls=ioctls,
        ioctl_latency=a.ioctl_latency.merged(b.ioctl_latency),
        launches=a.launches + b.launches,
        waits=a.waits + b.waits,
        polls=a.polls + b.polls,
        tsgs=a.tsgs + b.tsgs,
        channels=a.channels + b.channels,
        device_memory=a.device_memory + b.device_memory,
        processes=a.processes + b.processes,
    )


# How old a read of the launch counters a published view may take (it is rebuilt every second).
LAUNCHES_FRESH_S = 0.5


class ProbeSource:
    def __init__(self, probe: Source, cgroups: CgroupMap | None = None) -> None:
        self.probe = probe
        self.view = LiveView(probe, cgroups if cgroups is not None else CgroupMap())
        self.up = False
        self.error: str | None = None
        self._gpus: dict[int, set[int]] = defaultdict(set)
        self._lost = 0
        self._launches: tuple[float, dict[int, int]] | None = None  # (when, the last read)
        self._held_cache: tuple[int, dict[int, DriverActivity]] | None = None
        # Called with the pid of every process that exits (the rm enforcer lets go of its files).
        self.on_exit: list[Callable[[int], None]] = []

    def refresh(self) -> None:
        try:
            records = self.probe.poll(0)
        except Exception as error:  # the probe's buffer reader raises whatever bcc raises
            self.up, self.error = False, str(error)
            return
        for record in records:
            if record.kind == "exit" and record.pid is not None:
                for callback in self.on_exit:
                    callback(record.pid)
            if (
                record.kind == "open"
                and record.cgroup is not None
                and self.probe.node_of(record.major, record.minor) is Node.GPU
            ):
                self._gpus[record.cgroup].add(record.minor)
        self.view.feed(records)
        self.up, self.error = True, None

    def prune(self) -> int:
        """Drop the counters of cgroups that were removed and hold no process any more."""
        forget = getattr(self.probe, "forget", None)
        if forget is None:
            return 0
        alive = {proc.cgroup for proc in self.view.tracker.processes.values()}
        root = self.view.cgroups.root
        gone = []
        for cgid in self.probe.counters():
            path = self.view.cgroups.path_of(cgid)
            if cgid not in alive and (path is None or not (root / path.lstrip("/")).exists()):
                gone.append(cgid)
        for cgid in gone:
            self._gpus.pop(cgid, None)
        return int(forget(gone)) if gone else 0

    @property
    def lost(self) -> int:
        """Events the probe could not stream since it started: each may be a missed exit, open or
        RM_ALLOC, so the count is exported for an operator to watch."""
        # A map read of a probe that is going away may fail: the last count stands.
        with contextlib.suppress(Exception):
            self._lost = int(self.probe.lost)
        return self._lost

    def launches(self) -> dict[int, int]:
        """CUDA activity per cgroup id, read fresh (cheap where the probe offers it): launches,
        and for the real probe also its waits for the GPU (NvProbe._activity), what the rm
        enforcer's sensor watches move."""
        cheap = getattr(self.probe, "launches", None)
        if cheap is not None:
            read = dict(cheap())
        else:
            read = {cgid: c.launches for cgid, c in self.probe.counters().items()}
        self._launches = (time.monotonic(), read)
        return dict(read)

    def launches_of(self, cgroups: Sequence[int]) -> dict[int, int]:
        """The launch counters of ``cgroups`` only (absent: none counted yet), each read on its
        own where the probe can (two syscalls for a holder's cgroups against a read of the whole
        map); the rm enforcer's look at the pod holding the GPU asks for these."""
        single = getattr(self.probe, "launches_of", None)
        if single is not None:
            return dict(single(cgroups))
        read = self.launches()
        return {cgid: read[cgid] for cgid in cgroups if cgid in read}

    def recent_launches(self, max_age_s: float = LAUNCHES_FRESH_S) -> dict[int, int]:
        """The last read of :meth:`launches` if it is at most ``max_age_s`` old, else a new one:
        the rm enforcer reads them at every look, and a view needs no fresher ones."""
        if self._launches is not None and time.monotonic() - self._launches[0] <= max_age_s:
            return dict(self._launches[1])
        return self.launches()

    def close(self) -> None:
        close = getattr(self.probe, "close", None)
        if close is not None:
            close()
        self.view.cgroups.close()

    def activity(self, counters: bool = True) -> Mapping[int, CgroupActivity]:
        """Per cgroup id that the probe has seen: its path, driver activity and GPUs.

        ``counters=False`` leaves out the ioctl counters (by escape, control, allocation class,
        latency): they are four hash maps whose batch read walks every bucket of their
        ``max_entries`` (up to 131 072): read every second, 15 % of the daemon's CPU with 10
        busy pods (py-spy on an H100, BENCHMARKS.md 2026-11-25). Only the exporter shows them,
        so the daemon reads them when it is scraped. Launches come from the small per-cgroup map
        the rm enforcer reads anyway.
        """
        held = self._held()
        read = self.probe.counters() if counters else {}
        launches = {} if counters else self.recent_launches()
        calls: Mapping[int, tuple[int, int, int]] = (
            {} if counters else dict(getattr(self.probe, "cuda_calls", None) or {})
        )
        found: dict[int, CgroupActivity] = {}
        for cgid in set(read) | set(launches) | set(held):
            path = self.view.cgroups.path_of(cgid) or f"cgroup#{cgid}"
            base = held.get(cgid, DriverActivity())
            count = read.get(cgid)
            if count is not None:
                base = dataclasses.replace(
                    base,
                    ioctls=dict(count.escapes),
                    ioctl_latency=Histogram.from_log2_us(
                        count.latency_log2, count.latency_sum_ns / 1e9
                    ),
                    launches=count.launches,
                    waits=count.waits,
                    polls=count.polls,
                )
            elif cgid in calls:
                # The probe's read of the activity the sensor watches, split into its calls.
                launched, waits, polls = calls[cgid]
                base = dataclasses.replace(base, launches=launched, waits=waits, polls=polls)
            elif cgid in launches:
                base = dataclasses.replace(base, launches=launches[cgid])
            found[cgid] = CgroupActivity(path, base, frozenset(self._gpus.get(cgid, ())))
        return found

    def _held(self) -> Mapping[int, DriverActivity]:
        """What each cgroup's processes hold (TSGs, channels, device memory), from the tracker;
        kept while the tracker is unchanged (a summary walks every RM object of a process, and
        busy CUDA processes make no ioctls between their allocations)."""
        tracker = self.view.tracker
        if self._held_cache is not None and self._held_cache[0] == tracker.generation:
            return self._held_cache[1]
        held: dict[int, DriverActivity] = {}
        for pid, proc in tracker.processes.items():
            if proc.cgroup is None:
                continue
            summary = tracker.summary(pid)
            one = DriverActivity(
                tsgs=summary.tsgs,
                channels=summary.channel_count,
                device_memory=summary.device_bytes,
                processes=1,
            )
            previous = held.get(proc.cgroup)
            held[proc.cgroup] = one if previous is None else merge(previous, one)
        self._held_cache = (tracker.generation, held)
        return held
