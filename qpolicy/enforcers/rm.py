"""The rm enforcer: qpolicy's periods on a real GPU, through RM controls sent from userspace.

For hosts that cannot load an unsigned kernel module (h200-findings §4). The eBPF probe's tracker
knows each process's RM client, subdevice, TSGs and channels and the fd the client lives on; the
enforcer takes that fd with ``pidfd_getfd`` and sends, on the tenant's own objects:

* ``FIFO_DISABLE_CHANNELS`` to close and open a pod's channels at turn boundaries (the one lever
  measured to stop a process on a GSP GPU), break before make, so turns never overlap and a pod's
  GPU time is the time its channels were open;
* ``SET_TIMESLICE`` to give online pods a long timeslice and offline pods a short one.

What it cannot do, by construction: a tenant may send the same controls itself and re-open its own
channels; device memory cannot be limited (nothing stands between RM_ALLOC and the driver); timing
comes from a userspace thread, so a switch costs about a control (~0.6 ms) of idle GPU; and an
online pod's GPU time is not measured (its channels stay open while offline pods run). The kernel
module removes all four.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qpolicy.enforcer import PodUsage
from qpolicy.enforcers.slicer import SliceScheduler
from qpolicy.engine import Plan
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.tracker import ClientChannels
from qpolicy.runtime.clock import Loop
from qpolicy.runtime.worker import ControlWorker, Worker

log = logging.getLogger(__name__)

RECORD_NAME = "rm-disabled.json"
ERROR_LOG_EVERY_S = 60.0


class PodResolver(Protocol):
    """What the enforcer needs to know about pods, from the probe and the desired state."""

    def groups(self, pod: str) -> list[ClientChannels]:
        """The channel groups of the pod's live processes."""
        ...

    def launches(self) -> Mapping[str, int]:
        """Cumulative CUDA launches per pod."""
        ...


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), to tell a pid from its reuse."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


class BorrowedFiles:
    """Descriptors taken from tenants, one per (pid, fd), closed once the process is gone.

    Holding a tenant's descriptor holds its RM clients, and with them its GPU memory: every one is
    closed as soon as the probe reports the process's exit, or when the enforcer stops.
    """

    def __init__(self) -> None:
        self._fds: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def get(self, pid: int, fd: int) -> int:
        with self._lock:
            mine = self._fds.get((pid, fd))
            if mine is None:
                mine = self._fds[(pid, fd)] = rmctl.borrow_fd(pid, fd)
            return mine

    def forget(self, pid: int) -> None:
        with self._lock:
            for key in [k for k in self._fds if k[0] == pid]:
                os.close(self._fds.pop(key))

    def close_all(self) -> None:
        with self._lock:
            for mine in self._fds.values():
                os.close(mine)
            self._fds.clear()

    def __len__(self) -> int:
        return len(self._fds)


@dataclass
class DisabledRecord:
    """The channel groups the enforcer has closed, on disk, so a restarted daemon can open them.

    Rewritten (temp file and rename) whenever the set changes. It is not fsynced: it only matters
    while the processes it names live, and they do not outlive the machine.
    """

    path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def key(group: ClientChannels) -> str:
        return f"{group.pid}:{group.fd}:{group.client:#x}"

    def closed(self, group: ClientChannels) -> None:
        with self._lock:
            self.entries[self.key(group)] = {
                "pid": group.pid,
                "start_time": process_start_time(group.pid) if group.pid else None,
                "fd": group.fd,
                "client": group.client,
                "subdevice": group.subdevice,
                "channels": list(group.channels),
            }
            self._write()

    def opened(self, group: ClientChannels) -> None:
        with self._lock:
            if self.entries.pop(self.key(group), None) is not None:
                self._write()

    def _write(self) -> None:
        if not self.entries:
            self.path.unlink(missing_ok=True)  # everything is open: nothing to restore
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)


def restore(path: Path) -> tuple[int, list[str]]:
    """Re-open what a previous daemon left closed; returns (groups opened, problems).

    Run at start-up, before anything else is sent: a daemon killed in the middle of a period
    leaves some pods' channels closed, and nobody else would open them.
    """
    try:
        entries: dict[str, dict[str, Any]] = json.loads(path.read_text())
    except FileNotFoundError:
        return 0, []
    except (OSError, ValueError) as error:
        return 0, [f"cannot read {path}: {error}"]
    opened = 0
    problems: list[str] = []
    for key, entry in entries.items():
        pid = entry.get("pid")
        if not isinstance(pid, int) or process_start_time(pid) != entry.get("start_time"):
            continue  # the process is gone: its channels went with it
        try:
            fd = rmctl.borrow_fd(pid, int(entry["fd"]))
            try:
                result = rmctl.disable_channels(
                    fd,
                    int(entry["client"]),
                    int(entry["subdevice"]),
                    entry["channels"],
                    disable=False,
                )
            finally:
                os.close(fd)
            if result.ok:
                opened += 1
            else:
                problems.append(f"{key}: RM status {result.status:#x}")
        except (rmctl.RmError, KeyError, TypeError, ValueError) as error:
            problems.append(f"{key}: {error}")
    path.unlink(missing_ok=True)
    return opened, problems


class RmChannelControl:
    """The slice scheduler's ChannelControl over RM controls, sent by a worker thread."""

    def __init__(
        self,
        loop: Loop,
        resolver: PodResolver,
        files: BorrowedFiles,
        record: DisabledRecord,
        worker: Worker | None = None,
    ) -> None:
        self.loop = loop
        self.resolver = resolver
        self.files = files
        self.record = record
        self.worker = worker or ControlWorker(loop)
        self._lock = threading.Lock()
        # Per pod: when its channels last opened (None while closed) and its open time so far.
        self._opened_at: dict[str, float | None] = {}
        self._open_total: dict[str, float] = {}
        self._original_timeslice: dict[tuple[int, int, int], int] = {}
        self._wanted_timeslice: dict[str, int] = {}
        self._timeslice_sent: set[tuple[int, int, int]] = set()
        self.errors = 0
        self._last_error_log: dict[str, float] = {}

    @property
    def latency_us(self) -> float:
        return self.worker.latency_us

    def settled_at(self) -> float:
        return self.worker.settled_at()

    def open_time_us(self, pod: str) -> float:
        with self._lock:
            since = self._opened_at.get(pod)
            total = self._open_total.get(pod, 0.0)
        return total + (self.loop.now - since if since is not None else 0.0)

    def track(self, pod: str) -> None:
        """Count an untouched pod's time from now: its channels are as the tenant left them."""
        with self._lock:
            self._opened_at.setdefault(pod, self.loop.now)

    def is_open(self, pod: str) -> bool:
        with self._lock:
            # Unknown pods have never been touched: their channels are as the tenant left them.
            return self._opened_at.get(pod, 0.0) is not None

    def _mark(self, pod: str, opened: bool) -> None:
        now = self.loop.now
        with self._lock:
            since = self._opened_at.get(pod)
            if opened and since is None:
                self._opened_at[pod] = now
            elif not opened and since is not None:
                self._open_total[pod] = self._open_total.get(pod, 0.0) + now - since
                self._opened_at[pod] = None
            elif not opened and pod not in self._opened_at:
                self._opened_at[pod] = None

    def _complain(self, pod: str, message: str) -> None:
        self.errors += 1
        now = time.monotonic()
        if now - self._last_error_log.get(pod, -ERROR_LOG_EVERY_S) >= ERROR_LOG_EVERY_S:
            self._last_error_log[pod] = now
            log.warning("pod %s: %s", pod, message)

    def set_enabled(self, pod: str, enabled: bool) -> None:
        groups = [g for g in self.resolver.groups(pod) if g.subdevice is not None and g.pid]
        debug = log.isEnabledFor(logging.DEBUG)
        if debug and not groups:
            log.debug("pod %s: %s with no channels known", pod, "open" if enabled else "close")

        def job() -> float:
            sent = 0
            for group in groups:
                assert group.pid is not None and group.fd is not None
                assert group.subdevice is not None
                try:
                    fd = self.files.get(group.pid, group.fd)
                    result = rmctl.disable_channels(
                        fd, group.client, group.subdevice, group.channels, disable=not enabled
                    )
                    sent += 1
                except rmctl.RmError as error:
                    self._complain(pod, str(error))
                    continue
                if debug:
                    log.debug(
                        "pod %s: %s pid %d client %#x channels %d: %#x",
                        pod,
                        "open" if enabled else "close",
                        group.pid,
                        group.client,
                        len(group.channels),
                        result.status,
                    )
                if not result.ok:
                    self._complain(pod, f"FIFO_DISABLE_CHANNELS answered {result.status:#x}")
                elif enabled:
                    self.record.opened(group)
                else:
                    self.record.closed(group)
            self._mark(pod, enabled)
            return float(sent)

        self.worker.submit(job)

    def set_timeslice(self, pod: str, timeslice_us: int | None) -> None:
        """Give the pod's TSGs ``timeslice_us`` (None: their own again), now and as they appear."""
        if timeslice_us is None:
            self._wanted_timeslice.pop(pod, None)
        else:
            self._wanted_timeslice[pod] = timeslice_us
        self._send_timeslices(pod, timeslice_us, only_new=False)

    def forget(self, pid: int) -> None:
        """Drop what is kept about the TSGs of a process that exited."""
        for key in [k for k in self._original_timeslice if k[0] == pid]:
            self._original_timeslice.pop(key, None)
        self._timeslice_sent = {k for k in self._timeslice_sent if k[0] != pid}

    def refresh_timeslices(self) -> None:
        """Set the wanted timeslice on TSGs created since it was set: processes start late."""
        for pod, timeslice_us in list(self._wanted_timeslice.items()):
            self._send_timeslices(pod, timeslice_us, only_new=True)

    def _send_timeslices(self, pod: str, timeslice_us: int | None, *, only_new: bool) -> None:
        todo = [
            (group, tsg)
            for group in self.resolver.groups(pod)
            if group.pid
            for tsg in group.tsgs
            if not (only_new and (group.pid or 0, group.client, tsg) in self._timeslice_sent)
        ]
        if not todo:
            return
        for group, tsg in todo:
            self._timeslice_sent.add((group.pid or 0, group.client, tsg))

        def job() -> float:
            sent = 0
            for group, tsg in todo:
                assert group.pid is not None and group.fd is not None
                key = (group.pid, group.client, tsg)
                try:
                    fd = self.files.get(group.pid, group.fd)
                    if key not in self._original_timeslice:
                        result, value = rmctl.get_timeslice(fd, group.client, tsg)
                        sent += 1
                        if result.ok:
                            self._original_timeslice[key] = value
                    target = (
                        self._original_timeslice.get(key) if timeslice_us is None else timeslice_us
                    )
                    if target is not None:
                        result = rmctl.set_timeslice(fd, group.client, tsg, target)
                        sent += 1
                        log.debug(
                            "pod %s: timeslice %d us on TSG %#x of pid %d: %#x",
                            pod,
                            target,
                            tsg,
                            group.pid,
                            result.status,
                        )
                except rmctl.RmError as error:
                    self._complain(pod, str(error))
            return float(sent)

        self.worker.submit(job)


class RmShared:
    """What the rm enforcers of a node's GPUs share: one control thread, the borrowed
    descriptors and the record of closed channels."""

    def __init__(self, loop: Loop, state_dir: Path, worker: Worker | None = None) -> None:
        self.loop = loop
        self.worker = worker if worker is not None else ControlWorker(loop)
        self.files = BorrowedFiles()
        self.record = DisabledRecord(state_dir / RECORD_NAME)
        self.controls: list[RmChannelControl] = []

    def forget(self, pid: int) -> None:
        """A process exited: close its borrowed descriptors, drop what was kept about it."""
        self.files.forget(pid)
        for control in self.controls:
            control.forget(pid)

    def close(self) -> None:
        if not self.worker.drain():
            log.warning("controls still queued at shutdown; %s keeps the record", self.record.path)
        self.worker.close()
        self.files.close_all()


class RmUsageSensor:
    """GPU time from open intervals (less the time an idle pod sits open); activity from
    libcuda launches seen by the probe.

    A pod is idle once its channels have been open for the grace without it launching. Only open
    time counts: a closed pod cannot make progress, so its process may be waiting on work stuck
    behind the closed channels and launch nothing, and a long wait must not make it look idle.
    A pod that launches while closed (launching needs no open channel) is busy again at once.
    """

    # Open time is when a pod may run, not when it ran: an online pod that shares the GPU with
    # others is not capped from it (the offline timeslice keeps it ahead instead).
    exact = False

    def __init__(self, control: RmChannelControl, resolver: PodResolver, grace_us: float) -> None:
        self.control = control
        self.resolver = resolver
        self.grace_us = grace_us
        self._count: dict[str, int] = {}
        # Per pod: open time since its last launch, and the pod's open time, as of the last poll.
        self._open_idle: dict[str, float] = {}
        self._open_seen: dict[str, float] = {}
        self._polled_at: float | None = None
        self._busy: dict[str, bool] = {}
        self._unused: dict[str, float] = {}
        self.throttled_us: dict[str, float] = {}

    def poll(self) -> None:
        now = self.control.loop.now
        since = now - self._polled_at if self._polled_at is not None else 0.0
        self._polled_at = now
        for pod, count in self.resolver.launches().items():
            if pod not in self._count:
                self.control.track(pod)
            opened = self.control.open_time_us(pod)
            delta = opened - self._open_seen.get(pod, opened)
            self._open_seen[pod] = opened
            if count != self._count.get(pod):
                self._count[pod] = count
                self._open_idle[pod] = 0.0
                continue
            before = self._open_idle[pod]
            self._open_idle[pod] = before + delta
            # An idle pod is left open; time it sits open past the grace is not GPU time.
            past_grace = min(delta, before + delta - self.grace_us)
            if past_grace > 0:
                self._unused[pod] = self._unused.get(pod, 0.0) + past_grace
        for pod in self._count:
            is_open = self.control.is_open(pod)
            busy = self.idle_for_us(pod) < self.grace_us
            if not is_open and busy:
                self.throttled_us[pod] = self.throttled_us.get(pod, 0.0) + since
            if busy != self._busy.get(pod) and log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pod %s: %s (%d launches, %s)",
                    pod,
                    "busy" if busy else "idle",
                    self._count[pod],
                    "open" if is_open else "closed",
                )
            self._busy[pod] = busy

    def gpu_time_us(self, pod: str) -> float:
        opened = self.control.open_time_us(pod)
        unused = self._unused.get(pod, 0.0)
        idle = self._open_idle.get(pod)
        if idle is not None:  # and the part past the grace since the last poll
            delta = opened - self._open_seen[pod]
            unused += max(0.0, min(delta, idle + delta - self.grace_us))
        return opened - unused

    def idle_for_us(self, pod: str) -> float:
        idle = self._open_idle.get(pod)
        if idle is None:
            return math.inf  # never launched anything
        return idle + self.control.open_time_us(pod) - self._open_seen[pod]


class RmEnforcer:
    """The Enforcer interface over the slice scheduler, the RM controls and the probe."""

    name = "rm"

    def __init__(
        self,
        shared: RmShared,
        resolver: PodResolver,
        *,
        idle_grace_us: float = 50_000.0,
        poll_us: float = 25_000.0,
    ) -> None:
        self.loop = shared.loop
        self.shared = shared
        self.control = RmChannelControl(
            shared.loop, resolver, shared.files, shared.record, shared.worker
        )
        shared.controls.append(self.control)
        self.sensor = RmUsageSensor(self.control, resolver, idle_grace_us)
        self.scheduler = SliceScheduler(
            shared.loop,
            self.control,
            self.sensor,
            idle_grace_us=idle_grace_us,
            poll_us=math.inf,  # it looks whenever the sensor has polled
            handover="break-before-make",
        )
        self._poller = shared.loop.every(poll_us, self._poll)

    def _poll(self) -> None:
        self.sensor.poll()
        self.scheduler.observe()

    def collect(self) -> Mapping[str, PodUsage]:
        usage = self.scheduler.collect()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "period used %s",
                ", ".join(
                    f"{pod} {u.used_us / 1000:.1f} ms{' hungry' if u.hungry else ''}"
                    for pod, u in usage.items()
                ),
            )
        return usage

    def apply(self, plan: Plan) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "plan %s",
                ", ".join(f"{s.pod} {s.allocation:.3f}" for s in plan.slices),
            )
        self.scheduler.apply(plan)
        self.control.refresh_timeslices()

    def stand_down(self) -> None:
        """Open every pod and restore timeslices, and keep watching for the next plan."""
        self.scheduler.release()

    def release(self) -> None:
        """Open every channel this enforcer closed and restore timeslices (queued controls)."""
        self._poller.cancel()
        self.scheduler.release()
        if self.control in self.shared.controls:
            self.shared.controls.remove(self.control)
