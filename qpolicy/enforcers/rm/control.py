"""The slice scheduler's levers on a real GPU: RM controls on tenants' own objects.

``FIFO_DISABLE_CHANNELS`` closes and opens a pod's channel groups (sent to the subdevice of the GPU
each group's channels are on), ``SET_TIMESLICE`` sets its TSGs' timeslices (and, under the CTA
strategy, :mod:`~.preemption` its contexts' compute preemption mode). Controls block for
~0.6 ms under GSP, so they run on the control worker, in order; the loop thread only builds them.

What a control changed is remembered by pod, not only re-derived from who the pod is now: a pod
that leaves the desired state (or moves to another GPU) no longer resolves to its processes, yet
the channels closed and the timeslices set on its behalf must be undone. Every change is also
written to the :class:`~qpolicy.enforcers.rm.record.RmRecord` so that a daemon killed with
SIGKILL leaves nothing changed behind it.

GSP counts closes: a channel closed twice runs again only after two opens, and an open of a
channel not closed does nothing (an H200, driver 580.159.04: tools/gpu/disable_nesting.py). So
a group closed here is never closed again before it is opened, and an open RM refused is sent
again until it is carried out or the pod is no longer wanted open: otherwise the pod would stay
shut out while the slice scheduler believes it open.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from qpolicy.enforcers.rm.files import BorrowedFiles
from qpolicy.enforcers.rm.preemption import PreemptionModes
from qpolicy.enforcers.rm.record import RmRecord, group_key
from qpolicy.enforcers.rm.resolver import PodResolver
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.tracker import ClientChannels
from qpolicy.runtime.clock import Loop
from qpolicy.runtime.worker import ControlWorker, Worker
from qpolicy.telemetry.gpuprocs import is_mps_server

log = logging.getLogger(__name__)

ERROR_LOG_EVERY_S = 60.0
# A refused open is sent again this much later (µs), for as long as the pod is wanted open.
OPEN_RETRY_US = 50_000.0

# A TSG is named by its process, client and handle.
TsgKey = tuple[int, int, int]


def compute_contexts(
    groups: list[ClientChannels], mps_servers: frozenset[int] = frozenset()
) -> int:
    """How many CUDA contexts ``groups`` hold: per process, its TSGs with a compute object (one
    per context), or one for a process whose compute object has not been seen yet (it makes its
    TSGs before it, and a process is one context at least). A process with two contexts on the
    GPU switches against itself at a short timeslice just as two processes do.

    Where the groups hold an MPS server (pid in ``mps_servers``), a process without a compute
    object is one of its clients and no context of its own: the clients' kernels run in the
    server's context, which nothing switches between (an offline pod of two 8192 trainers run
    as clients of one server kept 105 % of native's throughput; BENCHMARKS.md, 2026-11-27,
    twelfth session). Such a pod is one context, and keeps the class's timeslice."""
    computing: dict[int, set[tuple[int, int]]] = {}
    for group in groups:
        if group.pid is None or not group.tsgs:
            continue
        tsgs = computing.setdefault(group.pid, set())
        tsgs.update((group.client, tsg) for tsg in group.compute_tsgs)
    served = not mps_servers.isdisjoint(computing)
    least = 0 if served else 1
    return sum(max(len(tsgs), least) for tsgs in computing.values())


class RmChannelControl:
    """The slice scheduler's ChannelControl over RM controls, sent by a worker thread."""

    def __init__(
        self,
        loop: Loop,
        resolver: PodResolver,
        files: BorrowedFiles,
        record: RmRecord,
        worker: Worker | None = None,
    ) -> None:
        self.loop = loop
        # Looked up when made, so that a test can stand in for /proc.
        self.is_mps_server: Callable[[int], bool] = is_mps_server
        self.resolver = resolver
        self.files = files
        self.record = record
        self.worker = worker or ControlWorker(loop)
        # Everything below is shared by the loop thread (which builds controls) and the worker
        # (which sends them and learns what RM answered).
        self._lock = threading.Lock()
        # Per pod: when its channels last opened (None while closed) and its open time so far.
        self._opened_at: dict[str, float | None] = {}
        self._open_total: dict[str, float] = {}
        # Per pod: the groups RM closed for it, to be opened whoever the pod is by then.
        self._closed: dict[str, dict[str, ClientChannels]] = {}
        # Per TSG: the timeslice it had before it was first changed; per pod, the TSGs changed.
        self._original_timeslice: dict[TsgKey, int] = {}
        self._changed: dict[str, dict[TsgKey, int]] = {}  # TSG -> the fd it is reached on
        self._wanted_timeslice: dict[str, int] = {}
        # Per TSG the wanted timeslice was sent to: how many times the tenant had set it itself
        # by then. A later set of its own (libcuda's, some 110 ms after the TSG exists) undoes
        # ours, and is answered by sending ours again.
        self._timeslice_sent: dict[TsgKey, int] = {}
        # Pods whose TSGs keep their own timeslices because several of the pod's CUDA contexts
        # are on this GPU (_send_timeslices), with how many there were.
        self._several: dict[str, int] = {}
        # Per pid: whether it is an MPS server (read from /proc once per process).
        self._mps_server: dict[int, bool] = {}
        # Per pod: whether the last set_enabled asked for its channels open (queued or sent).
        self._wanted_open: dict[str, bool] = {}
        # Per pod: the last read of its TSGs' preemption saves (read_preemptions), numbered.
        self._preemption_reads: dict[str, int] = {}
        self._preemptions: dict[str, tuple[int, dict[TsgKey, int] | None]] = {}
        #: Set when RM refused GR_GET_CTXSW_STATS: idle pods are then not checked on the GPU.
        self.preemptions_refused: int | None = None
        self.errors = 0
        self._last_error_log: dict[str, float] = {}
        # Pods with an open to send again (a refused one), already scheduled on the loop.
        self._open_retry: set[str] = set()
        #: Offline pods' compute preemption mode, where the strategy sets one.
        self.preemption = PreemptionModes(resolver, files, record, self.worker, self._complain)

    @property
    def latency_us(self) -> float:
        return self.worker.latency_us

    def settled_at(self) -> float:
        return self.worker.settled_at()

    # -- open time ---------------------------------------------------------------------------

    def open_time_us(self, pod: str) -> float:
        with self._lock:
            since = self._opened_at.get(pod)
            total = self._open_total.get(pod, 0.0)
        return total + (self.loop.now - since if since is not None else 0.0)

    def open_times_us(self) -> tuple[dict[str, float], dict[str, bool]]:
        """Every tracked pod's open time so far and whether it is open, as of one instant (one
        lock and one clock read for all of them: the sensor asks at every poll)."""
        now = self.loop.now
        with self._lock:
            totals = {
                pod: self._open_total.get(pod, 0.0) + (now - since if since is not None else 0.0)
                for pod, since in self._opened_at.items()
            }
            is_open = {pod: since is not None for pod, since in self._opened_at.items()}
        return totals, is_open

    def track(self, pod: str) -> None:
        """Count an untouched pod's time from now: its channels are as the tenant left them."""
        with self._lock:
            self._opened_at.setdefault(pod, self.loop.now)

    def is_open(self, pod: str) -> bool:
        with self._lock:
            # Unknown pods have never been touched: their channels are as the tenant left them.
            return self._opened_at.get(pod, 0.0) is not None

    def wanted_open(self, pod: str) -> bool:
        """Whether the pod's channels are open once the queued controls have settled."""
        with self._lock:
            return self._wanted_open.get(pod, True)

    def closed_pods(self) -> list[str]:
        """Pods with channel groups closed by this control right now."""
        with self._lock:
            return sorted(pod for pod, groups in self._closed.items() if groups)

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

    # -- channels ----------------------------------------------------------------------------

    def set_enabled(self, pod: str, enabled: bool) -> None:
        with self._lock:
            self._wanted_open[pod] = enabled
        groups = {
            group_key(g): g
            for g in self.resolver.groups(pod)
            if g.subdevice is not None and g.pid and g.fd is not None
        }
        if enabled:
            with self._lock:
                # Whatever was closed for the pod is opened, whether or not it still resolves.
                groups = {**self._closed.get(pod, {}), **groups}
        if log.isEnabledFor(logging.DEBUG) and not groups:
            log.debug("pod %s: %s with no channels known", pod, "open" if enabled else "close")
        self._send(pod, list(groups.values()), enabled)

    def _send(self, pod: str, todo: list[ClientChannels], enabled: bool) -> None:
        debug = log.isEnabledFor(logging.DEBUG)

        def job() -> float:
            sent = 0
            refused = False
            for group in todo:
                assert group.pid is not None and group.fd is not None
                assert group.subdevice is not None
                if not enabled:
                    # Closed already (its open refused): a second close would need a second
                    # open. Asked here, in the order the controls are sent.
                    with self._lock:
                        if group_key(group) in self._closed.get(pod, {}):
                            continue
                    self.record.closing(group)  # before: a kill after the close is undone
                problem: str | None = None
                fd: int | None = None
                try:
                    fd = self.files.get(group.pid, group.fd)
                    result = rmctl.disable_channels(
                        fd, group.client, group.subdevice, group.channels, disable=not enabled
                    )
                    sent += 1
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
                        problem = f"FIFO_DISABLE_CHANNELS answered {result.status:#x}"
                except rmctl.RmError as error:
                    problem = str(error)
                if problem is not None:
                    self._complain(pod, problem)
                    refused = True
                    if not enabled:
                        self.record.channels_opened(group)  # rmctl opened what it sent
                    if fd is not None:
                        self._look_for_gone(pod, group, fd, enabled)
                    continue
                key = group_key(group)
                with self._lock:
                    closed = self._closed.setdefault(pod, {})
                    if enabled:
                        closed.pop(key, None)
                    else:
                        closed[key] = group
                if enabled:
                    self.record.channels_opened(group)
            self._mark(pod, enabled)
            if enabled and refused:
                self._retry_open_later(pod)
            return float(sent)

        self.worker.submit(job)

    def _look_for_gone(self, pod: str, group: ClientChannels, fd: int, enabled: bool) -> None:
        """Called on the worker after RM refused a group: RM refuses the whole list where one
        channel is gone, and it can be gone unseen. RM invalidates a channel with an object it
        depends on (serverFreeResourceTree, 580.142): its context share, its TSG's graphics
        context, each of which RM may have made itself, at a handle the probe never saw. The
        group's channels RM no longer has working (rmctl.channel_lost) are forgotten on the loop
        thread, and the pod's channels sent again, so that one lost channel does not leave its
        neighbours open (a tenant that freed its own TSG's graphics context would run its other
        TSGs outside its turns) or closed."""
        gone = tuple(c for c in group.channels if rmctl.channel_lost(fd, group.client, c))
        if gone:
            self.loop.at(self.loop.now, lambda: self._forget_gone(pod, group, gone, enabled))

    def _forget_gone(
        self, pod: str, group: ClientChannels, gone: tuple[int, ...], enabled: bool
    ) -> None:
        assert group.pid is not None
        forgot = self.resolver.forget(group.pid, group.client, gone)
        log.info(
            "pod %s: pid %d client %#x: channels %s are lost in RM",
            pod,
            group.pid,
            group.client,
            ", ".join(f"{c:#x}" for c in gone),
        )
        key = group_key(group)
        with self._lock:
            closed = self._closed.get(pod, {})
            if key in closed:
                left = tuple(c for c in closed[key].channels if c not in gone)
                if left:
                    closed[key] = dataclasses.replace(closed[key], channels=left)
                else:
                    del closed[key]
            wanted = self._wanted_open.get(pod, True)
        if forgot and wanted == enabled:
            self.set_enabled(pod, enabled)

    def _retry_open_later(self, pod: str) -> None:
        """Called on the worker: send ``pod``'s refused opens again, from the loop thread."""
        with self._lock:
            if pod in self._open_retry:
                return
            self._open_retry.add(pod)
        self.loop.at(self.loop.now + OPEN_RETRY_US, lambda: self._retry_open(pod))

    def _retry_open(self, pod: str) -> None:
        with self._lock:
            self._open_retry.discard(pod)
            todo = list(self._closed.get(pod, {}).values())
            wanted = self._wanted_open.get(pod, True)
        if wanted and todo:
            self._send(pod, todo, True)

    # -- what the GPU did --------------------------------------------------------------------

    def read_preemptions(self, pod: str) -> int | None:
        """Ask RM, on the worker, how often GR has saved each of the pod's compute TSGs while it
        had work running (rmctl.preemption_saves); :meth:`preemptions` answers once the read
        settles. Returns the read's number, or None where nothing can be read (no TSG known,
        or RM refused the control before)."""
        if self.preemptions_refused is not None:
            return None
        todo = [
            (group, tsg)
            for group in self.resolver.groups(pod)
            if group.pid and group.fd is not None and group.subdevice is not None
            for tsg in group.compute_tsgs or group.tsgs
        ]
        if not todo:
            return None
        with self._lock:
            number = self._preemption_reads.get(pod, 0) + 1
            self._preemption_reads[pod] = number

        def job() -> float:
            saves: dict[TsgKey, int] | None = {}
            sent = 0
            for group, tsg in todo:
                assert group.pid is not None and group.fd is not None
                assert group.subdevice is not None
                try:
                    fd = self.files.get(group.pid, group.fd)
                    result, count = rmctl.preemption_saves(fd, group.client, group.subdevice, tsg)
                    sent += 1
                except rmctl.RmError as error:
                    # A process that exited meanwhile: its TSGs are not compared.
                    self._complain(pod, str(error))
                    continue
                if not result.ok:
                    if self.preemptions_refused is None:
                        log.warning(
                            "GR_GET_CTXSW_STATS answered %#x: idle pods are not checked on "
                            "the GPU for work still running",
                            result.status,
                        )
                    self.preemptions_refused = result.status
                    saves = None
                    break
                assert saves is not None
                saves[(group.pid, group.client, tsg)] = count
            with self._lock:
                self._preemptions[pod] = (number, saves)
            return float(sent)

        self.worker.submit(job)
        return number

    def preemptions(self, pod: str) -> tuple[int, dict[TsgKey, int] | None] | None:
        """The pod's last settled read: its number and the saves per TSG (None: refused)."""
        with self._lock:
            return self._preemptions.get(pod)

    # -- timeslices --------------------------------------------------------------------------

    def set_timeslice(self, pod: str, timeslice_us: int | None) -> None:
        """Give the pod's TSGs ``timeslice_us`` (None: their own again), now and as they appear."""
        if timeslice_us is None:
            self._wanted_timeslice.pop(pod, None)
            self._several.pop(pod, None)
            self._restore_timeslices(pod)
        else:
            self._wanted_timeslice[pod] = timeslice_us
            self._send_timeslices(pod, timeslice_us, only_new=False)

    def refresh_timeslices(self) -> None:
        """Set the wanted timeslice on TSGs created since it was set (processes start late), and
        again on TSGs whose tenant has set its own since (libcuda does, after creating them)."""
        for pod, timeslice_us in list(self._wanted_timeslice.items()):
            self._send_timeslices(pod, timeslice_us, only_new=True)

    def _mps_servers(self, groups: list[ClientChannels]) -> frozenset[int]:
        servers = []
        for pid in {g.pid for g in groups if g.pid}:
            with self._lock:
                known = self._mps_server.get(pid)
            if known is None:
                known = self.is_mps_server(pid)
                with self._lock:
                    self._mps_server[pid] = known
            if known:
                servers.append(pid)
        return frozenset(servers)

    def several_contexts(self) -> dict[str, int]:
        """Pods left at their TSGs' own timeslices, each with its number of CUDA contexts here
        (one per process, unless a process holds several)."""
        return dict(sorted(self._several.items()))

    def forget(self, pid: int) -> None:
        """Drop what is kept about the objects of a process that exited."""
        self.preemption.forget(pid)
        with self._lock:
            self._mps_server.pop(pid, None)
            for key in [k for k in self._original_timeslice if k[0] == pid]:
                del self._original_timeslice[key]
            for key in [k for k in self._timeslice_sent if k[0] == pid]:
                del self._timeslice_sent[key]
            for changed in self._changed.values():
                for key in [k for k in changed if k[0] == pid]:
                    del changed[key]
            for closed in self._closed.values():
                for gone in [k for k, g in closed.items() if g.pid == pid]:
                    del closed[gone]

    def _send_timeslices(self, pod: str, timeslice_us: int, *, only_new: bool) -> None:
        groups = [g for g in self.resolver.groups(pod) if g.pid and g.fd is not None]
        contexts = compute_contexts(groups, self._mps_servers(groups))
        if contexts > 1:
            # The class's timeslice is for a pod's TSGs against other pods'. Two busy contexts
            # of one pod given it switch against each other at every slice, and a compute
            # context switch (CILP on H100) costs ~0.4 ms: two 8192 trainers of one offline
            # pod kept 0.04 % of their native throughput at 1 us and 24 % at 128 us
            # (BENCHMARKS.md, 2026-11-26, sixth session). Their own timeslices (CUDA's 1-2 ms)
            # it is, until one context is left; online work then waits as under native
            # time-slicing while such a pod runs.
            if self._several.get(pod) != contexts:
                log.info(
                    "pod %s: %d CUDA contexts on this GPU: their TSGs keep their own timeslices "
                    "(%d us would switch them against each other)",
                    pod,
                    contexts,
                    timeslice_us,
                )
                self._several[pod] = contexts
            self._restore_timeslices(pod)
            return
        self._several.pop(pod, None)
        # Per TSG: whether the value to give back must be learnt again first (True: read it
        # from RM), and the tenant's own value where the probe read it from its call.
        todo: list[tuple[ClientChannels, int, bool, int | None]] = []
        with self._lock:
            for group in groups:
                for tsg in group.tsgs:
                    key = (group.pid or 0, group.client, tsg)
                    tenant_sets = group.tenant_sets(tsg)
                    sent = self._timeslice_sent.get(key)
                    if only_new and sent is not None and sent >= tenant_sets:
                        continue
                    # The tenant chose a timeslice of its own since ours was planned: that is
                    # the value to give back when the pod lets go. The probe reports a call once
                    # it has returned and the daemon reads its events later, so a set counted
                    # now may have come before ours, and RM may hold ours: the tenant's value is
                    # taken from its call where the probe read it, else from RM unless RM
                    # answers ours (call 12J, an H100: libcuda's set read back as 1 us, and the
                    # TSG given "back" 1 us starved its process beside its pod's other one).
                    again = sent is not None and sent < tenant_sets
                    self._timeslice_sent[key] = tenant_sets
                    todo.append((group, tsg, again, group.tenant_timeslice(tsg) if again else None))
        if not todo:
            return

        def job() -> float:
            sent = 0
            for group, tsg, again, chosen in todo:
                assert group.pid is not None and group.fd is not None
                key = (group.pid, group.client, tsg)
                try:
                    fd = self.files.get(group.pid, group.fd)
                    with self._lock:
                        original = self._original_timeslice.get(key)
                    value = chosen
                    if value is None and (original is None or again):
                        result, value = rmctl.get_timeslice(fd, group.client, tsg)
                        sent += 1
                        if not result.ok:
                            self._complain(pod, f"GET_TIMESLICE answered {result.status:#x}")
                            continue
                        if again and value == timeslice_us:
                            value = None  # ours: the tenant's set came before it
                    if value is not None and value != original:
                        original = value
                        # Written down before it is changed: a SIGKILL in between leaves a
                        # record that restores the value the TSG already has.
                        self.record.timeslice_changed(group.pid, group.fd, group.client, tsg, value)
                        with self._lock:
                            self._original_timeslice[key] = value
                    with self._lock:
                        self._changed.setdefault(pod, {})[key] = group.fd
                    result = rmctl.set_timeslice(fd, group.client, tsg, timeslice_us)
                    sent += 1
                    log.debug(
                        "pod %s: timeslice %d us on TSG %#x of pid %d: %#x",
                        pod,
                        timeslice_us,
                        tsg,
                        group.pid,
                        result.status,
                    )
                except rmctl.RmError as error:
                    self._complain(pod, str(error))
            return float(sent)

        self.worker.submit(job)

    def _restore_timeslices(self, pod: str) -> None:
        """Give every TSG changed for ``pod`` its own timeslice back, resolved or not."""
        with self._lock:
            changed = self._changed.pop(pod, {})
            todo = [
                (key, fd, self._original_timeslice[key])
                for key, fd in changed.items()
                if key in self._original_timeslice
            ]
            for key in changed:
                self._timeslice_sent.pop(key, None)
        if not todo:
            return

        def job() -> float:
            sent = 0
            for (pid, client, tsg), tenant_fd, original in todo:
                try:
                    fd = self.files.get(pid, tenant_fd)
                    result = rmctl.set_timeslice(fd, client, tsg, original)
                    sent += 1
                except rmctl.RmError as error:
                    self._complain(pod, str(error))
                    continue
                if result.ok:
                    self.record.timeslice_restored(pid, client, tsg)
                    with self._lock:
                        self._original_timeslice.pop((pid, client, tsg), None)
                else:
                    self._complain(pod, f"SET_TIMESLICE answered {result.status:#x}")
            return float(sent)

        self.worker.submit(job)
