"""The pods' GPU processes whose RM objects the probe never saw, and the searches that find them.

The rm enforcer learns a process's RM clients, TSGs and channels from the RM_ALLOC traffic the probe
sees. A process that allocated them while no daemon ran (it started before qpolicy was installed, or
while the daemon restarted, after the last handles a previous daemon wrote) would run ungoverned for
the rest of its life. Every :data:`LOOK_EVERY_S` the pods' cgroups are walked (a look, in slices,
spaced to a share of a core: :meth:`UnseenProcesses.refresh`) for processes that hold NVIDIA device
files and that the tracker cannot govern: none of their clients was seen allocated, or channels were
seen under a client whose allocation was not (events the probe lost). Each that has libcuda mapped
(a process without it has no CUDA context) is searched once: RM is asked about the client handles
made since the previous daemon's mark (from the handles file: a client that daemon made itself,
after which its probe saw every client made; see :attr:`UnseenProcesses.mark_to_write`) and those
objects were seen made under (:mod:`qpolicy.nvrm.discover`), in slices, 5 % of the daemon's time,
and what is found is added to the tracker, from when on the process is governed like any other. Each
client handle is checked first, by making a client at it on the daemon's own ``/dev/nvidiactl``
(rmctl.ClientCheck, which writes no kernel log line; the answers are shared by the searches), and
only those a client holds are asked; the search then goes on below the mark, through every client
handle, newest first (with no mark, the first daemon on a node, from the start). Where no check can
be made (no ``/dev/nvidiactl`` to open) only the range above a mark is asked, each question about a
client handle that does not exist writes a kernel log line, and the daemon's refusals are bounded
(:data:`REFUSALS`). A process the search finds no channels of (it holds no GPU work, or its objects
lie where the search does not look) stays listed as unseen, and is logged once.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qpolicy.enforcers.rm.record import process_running, process_start_time
from qpolicy.nvrm import discover, rmctl
from qpolicy.nvrm.abi import Node
from qpolicy.nvrm.tracker import Tracker
from qpolicy.telemetry.gpuprocs import cgroup_procs, holds_rm_files, maps_libcuda, nvidia_files

log = logging.getLogger(__name__)

#: Client handles a daemon's searches may ask that RM refuses to name, in all: each may be one
#: that does not exist, and write a line to the kernel log (call 23I, an H200), where client
#: handles cannot be checked first (a handle checked and held is another file's client: its
#: refusal logs nothing and is not counted). Call 24B: 300 clients freed between two
#: processes' start and the search, asked on their three control descriptors each, spent it.
REFUSALS = 1024

#: How often the pods' cgroups are looked through for processes the tracker cannot govern (from
#: one look's start to the next's), unless a look costs more than ``LOOK_SHARE`` of it.
LOOK_EVERY_S = 10.0
#: What a look may spend of one refresh of the daemon's loop, the thread that also hands the
#: GPUs over; the rest waits for the next refresh. The cgroups under a pod are its tenant's to
#: make (a pod running systemd, rootless containers): one of 5 000 cgroups held the loop 266 ms a
#: look, in one go, every 10 s (BENCHMARKS.md, 2026-12-07, fifty-eighth session).
LOOK_SLICE_S = 0.002
#: The share of a core looks may take, however many cgroups: a look that cost 250 ms starts 25 s
#: after the one before started, not 10 s.
LOOK_SHARE = 0.01


class ClientChecker(Protocol):
    """rmctl.ClientCheck: whether a client handle is in use, asked without a log line."""

    def in_use(self, handle: int) -> bool | None: ...

    def close(self) -> None: ...


class FreeClients:
    """The answers of a :class:`ClientChecker`, with the handles found free remembered (a bit
    each) while searches run: each process's search asks the same range of client handles, and
    a free one below RM's counter is only taken again by a client that names it."""

    def __init__(self, checker: ClientChecker) -> None:
        self.checker = checker
        self._free = bytearray(discover.CLIENT_HANDLE_COUNT // 8)
        self.checked = 0

    def in_use(self, handle: int) -> bool | None:
        index = (handle - discover.CLIENT_HANDLE_BASE) % discover.CLIENT_HANDLE_COUNT
        if self._free[index >> 3] & (1 << (index & 7)):
            return False
        self.checked += 1
        held = self.checker.in_use(handle)
        if held is False:
            self._free[index >> 3] |= 1 << (index & 7)
        return held

    def forget(self) -> None:
        self._free = bytearray(len(self._free))


def open_client_check() -> ClientChecker | None:
    try:
        return rmctl.ClientCheck()
    except OSError as error:
        log.warning(
            "cannot open /dev/nvidiactl (%s): searches of RM ask client handles one by one, a "
            "kernel log line for each that does not exist, and only those made since the mark",
            error,
        )
        return None


def governable(tracker: Tracker, pid: int) -> bool:
    """Whether the tracker knows enough of ``pid`` to govern it: a client it saw allocated (on a
    known file), no channels under a client it did not, and not the partial result of a search
    that did not finish (a daemon killed midway wrote what it had found so far)."""
    known = tracker.processes.get(pid)
    if known is None or known.incomplete:
        return False
    if not any(c.fd is not None for c in known.clients.values()):
        return False
    return all(group.fd is not None for group in tracker.channel_groups(pid))


@dataclass
class _Look:
    """A look under way: the pods' cgroups still to list, and what was found so far."""

    cgroups: Iterator[tuple[str, list[int]]]  # (pod, the pids of one of its cgroups)
    pending: deque[tuple[str, int]] = field(default_factory=deque)  # listed, not yet checked
    #: Per pid checked: whether it uses the GPU and the tracker cannot govern it (each pid's
    #: descriptors are listed once, under however many pods).
    checked: dict[int, bool] = field(default_factory=dict)
    unseen: dict[str, set[int]] = field(default_factory=dict)
    visited: int = 0  # cgroups listed
    spent: float = 0.0  # of the timer


@dataclass
class _Active:
    pod: str
    started: int  # the process's start time, which with its pid names it
    search: discover.Search
    since: float


class UnseenProcesses:
    """Finds the pods' processes the tracker cannot govern, and searches RM for their objects."""

    def __init__(
        self,
        tracker: Callable[[], Tracker],
        cgroup_root: Callable[[], Path | None],
        cgroup_of: Callable[[int], int | None],
        clock: Callable[[], float],
        *,
        askers: discover.AskerFactory | None = None,
        search_clock: Callable[[], float] = time.monotonic,
        newest: Callable[[], int | None] | None = None,
        start_time: Callable[[int], int | None] | None = None,
        files_of: Callable[[int], dict[int, Node]] | None = None,
        members: Callable[[Path, str], Iterable[list[int]]] | None = None,
        cuda: Callable[[int], bool] | None = None,
        running: Callable[[int, int], bool] | None = None,
        client_check: Callable[[], ClientChecker | None] | None = None,
        wall: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        # The defaults are looked up when called (tests replace the module's functions).
        self._tracker = tracker
        self._cgroup_root = cgroup_root
        self._cgroup_of = cgroup_of
        self._clock = clock
        # How a search asks RM through a process's descriptor (tests stand in for RM), and the
        # clock its slices are timed by.
        self._askers = askers or (lambda pid, fd: discover.borrowed_asker(pid, fd))
        self._search_clock = search_clock
        self._newest = newest or (lambda: rmctl.newest_client_handle())
        self._start_time = start_time or (lambda pid: process_start_time(pid))
        self._files_of = files_of or (lambda pid: nvidia_files(pid))
        # A pod's cgroups' pids, a list a cgroup (a look can stop between any two).
        self._members = members or (lambda root, pod: cgroup_procs(root, pod))
        self._cuda = cuda or (lambda pid: maps_libcuda(pid))
        self._running = running or (lambda pid, started: process_running(pid, started))
        self._open_check = client_check or open_client_check
        self._wall = wall
        # Measures a look's slices and what a whole look cost (``clock`` schedules the looks).
        self._timer = timer
        self._look: _Look | None = None
        self._look_started: float | None = None  # of ``clock``
        #: What the last finished look cost (s of the timer) and how many cgroups it listed.
        self.look_cost_s = 0.0
        self.cgroups = 0
        self.looks = 0  # finished
        #: Opened at the first search; None: not yet, False: could not be.
        self._check: FreeClients | bool | None = None
        #: Per pod: its processes using the GPU that the tracker cannot govern (yet).
        self.unseen: dict[str, list[int]] = {}
        self._active: dict[int, _Active] = {}
        #: (pid, start time) of each process searched to the end: what was found.
        self._done: dict[tuple[int, int], str] = {}
        self.found_processes = 0
        self.found_channels = 0
        #: When (wall clock) a search last found channels: what it found is governed from then,
        #: so a share measured from before it measures the search's time too.
        self.last_found_at: float | None = None
        self.asked = 0
        #: The previous daemon's mark (from the handles file): every client made after it, up to
        #: that daemon's end, its probe saw made. Clients made after it are what a search asks.
        #: None: not known, and processes no daemon saw are searched for only under client
        #: handles seen since.
        self.mark: int | None = None
        #: A client this daemon made itself at its last look (RM numbered it from its counter,
        #: after this daemon's probe was up): every client made after it, this probe sees made.
        self.own_mark: int | None = None
        self._looked = False
        #: Closed while searches ran: the gap before this daemon was not searched to its end.
        self._stopped_short = False
        self.refusals = discover.Refusals(REFUSALS)

    @property
    def searching(self) -> bool:
        return bool(self._active)

    @property
    def looking(self) -> bool:
        """A look is under way (started, not all its cgroups listed yet)."""
        return self._look is not None

    @property
    def look_every_s(self) -> float:
        """From one look's start to the next's: ``LOOK_EVERY_S``, or as long as keeps looks at
        ``LOOK_SHARE`` of a core."""
        return max(LOOK_EVERY_S, self.look_cost_s / LOOK_SHARE)

    def refresh(self, pods: Callable[[], Iterable[str]]) -> None:
        """The loop's share of the looks: one is started when due (``pods``: the cgroup paths to
        look through, asked then), and every refresh walks on for at most ``LOOK_SLICE_S``."""
        now = self._clock()
        if self._look is None and (
            self._look_started is None or now - self._look_started >= self.look_every_s
        ):
            self._look_started = now
            self.start_look(pods())
        if self._look is not None:
            self.continue_look(LOOK_SLICE_S)

    def look(self, pods: Iterable[str]) -> None:
        """A whole look at once: walk ``pods`` (cgroup paths) for processes the tracker cannot
        govern; start a search for each not searched before."""
        self.start_look(pods)
        self.continue_look(math.inf)

    def start_look(self, pods: Iterable[str]) -> None:
        """Starts a look through ``pods`` (one under way is given up); :meth:`continue_look`
        walks it. The pods are those of the start: one configured meanwhile waits for the next."""
        root = self._cgroup_root()
        if root is None:
            self._look = None
            return
        pods = list(pods)

        def cgroups() -> Iterator[tuple[str, list[int]]]:
            for pod in pods:
                for pids in self._members(root, pod):
                    yield pod, pids

        self._look = _Look(cgroups())

    def continue_look(self, budget_s: float) -> bool:
        """Walks the look under way on for about ``budget_s`` (of the timer): its cgroups, then
        its processes' descriptors, a cgroup or a process at a time. At its end the unseen
        processes are known and their searches started. True where no look is under way now."""
        look = self._look
        if look is None:
            return True
        started = self._timer()
        deadline = started + budget_s
        tracker = self._tracker()
        while True:
            if look.pending:
                pod, pid = look.pending.popleft()
                if pid not in look.checked:
                    look.checked[pid] = self._ungoverned(tracker, pid)
                if look.checked[pid]:
                    look.unseen.setdefault(pod, set()).add(pid)
            else:
                try:
                    pod, pids = next(look.cgroups)
                except StopIteration:
                    break
                look.visited += 1
                look.pending.extend((pod, pid) for pid in pids)
            if self._timer() >= deadline:
                look.spent += self._timer() - started
                return False
        look.spent += self._timer() - started
        self._look = None
        self.look_cost_s, self.cgroups = look.spent, look.visited
        self.looks += 1
        self._end_look(look)
        return True

    def _ungoverned(self, tracker: Tracker, pid: int) -> bool:
        """Whether ``pid`` uses the GPU and ``tracker`` cannot govern it."""
        # The tracker first: a governed process's files need not be listed (a readlink per
        # descriptor; a PyTorch process holds hundreds), and most are governed.
        return not governable(tracker, pid) and holds_rm_files(self._files_of(pid))

    def _end_look(self, look: _Look) -> None:
        """Starts a search for each process the look found that was not searched before."""
        # The mark is made as the look ends: every client made after it this daemon's probe
        # sees made (it is up before the first look starts), and the processes before it that
        # no probe saw are what the look found, searched before the mark is written on
        # (mark_to_write). A look's slices can span seconds: a mark made at its start would
        # leave the clients made meanwhile out of the searches' range.
        made = self._newest()
        if made is not None:
            self.own_mark = made
        self._looked = True
        tracker = self._tracker()
        # A process checked early in the look may have been found by a search since (a look's
        # slices can span seconds): governed now, it is neither unseen nor searched again.
        listed = {
            pod: [p for p in pids if not governable(tracker, p)]
            for pod, pids in look.unseen.items()
        }
        unseen = {pod: sorted(pids) for pod, pids in listed.items() if pids}
        wanted = {pid: pod for pod, pids in unseen.items() for pid in pids}
        for pid in [p for p in self._active if p not in wanted]:
            self._active.pop(pid).search.close()  # exited, or governed by now
        for pid, pod in wanted.items():
            started = self._start_time(pid)
            if started is None or pid in self._active or (pid, started) in self._done:
                continue
            if not self._cuda(pid):
                # No CUDA context to find: a search would spend its range of client handles,
                # and the daemon's refusals (kernel log lines), for nothing.
                self._done[(pid, started)] = "no libcuda"
                log.warning(
                    "pod %s: pid %d uses the GPU without libcuda and the probe never saw its RM "
                    "objects: not searched for; the rm enforcer cannot govern it",
                    pod,
                    pid,
                )
                continue
            known = tracker.processes.get(pid)
            # Clients objects were seen made under, whose own making was not seen: they exist.
            stand_ins = tuple(h for h, c in known.clients.items() if c.fd is None) if known else ()
            check = self._client_check()
            oldest = self.mark
            if check is not None and made is not None:
                # Client handles can be checked without a log line: every one there is, newest
                # first, down to (not) the one made above. Those since the mark come first, so a
                # process started in the gap is found as soon as before; one older than the mark
                # is found too (it started before the last daemon's probe, and its pod was
                # configured only after that daemon's first look). A process with no channels
                # costs the whole range: ~16 s of CPU at most, shared by the searches that run
                # together (FreeClients), at the searches' 5 %.
                oldest = made
            if oldest is None and not stand_ins:
                self._done[(pid, started)] = "no mark"
                log.warning(
                    "pod %s: pid %d uses the GPU but started before any daemon watched: its RM "
                    "objects cannot be searched for (asking RM about every client handle writes "
                    "a kernel log line per missing one); the rm enforcer cannot govern it; "
                    "restart it, or use qgpu.ko",
                    pod,
                    pid,
                )
                continue
            # Its descriptors as they are now: the look listed them when it checked the process,
            # perhaps seconds ago, and one closed since may name another file; the search sends
            # RM's controls through each.
            files = self._files_of(pid)
            if not holds_rm_files(files):
                continue  # closed them since: the next look sees
            # The client made above is freed again: the search starts just below it. Where none
            # can be made here, the newest this daemon's probe saw made will do.
            newest = discover.client_before(made) if made is not None else tracker.newest_client
            log.info(
                "pod %s: pid %d uses the GPU but the probe never saw its RM objects (it started "
                "before the probe); asking RM for them",
                pod,
                pid,
            )
            search = discover.Search(
                pid,
                files,
                newest,
                self._askers,
                self._search_clock,
                oldest=oldest,
                known=stand_ins,
                refusals=self.refusals,
                in_use=check.in_use if check is not None else None,
            )
            self._active[pid] = _Active(pod, started, search, self._clock())
        live = {pid for pids in unseen.values() for pid in pids}
        self._done = {key: why for key, why in self._done.items() if key[0] in live}
        self.unseen = unseen

    def _client_check(self) -> FreeClients | None:
        """The daemon's check of client handles, opened at its first search."""
        if self._check is None:
            opened = self._open_check()
            self._check = FreeClients(opened) if opened is not None else False
        return self._check if isinstance(self._check, FreeClients) else None

    @property
    def mark_to_write(self) -> int | None:
        """The mark this daemon leaves its successor: the clients after it were all seen made,
        or searched. Until its first look, and while a search runs, the gap before this daemon
        is not searched yet: the mark it was given. Then its own client's (a client a tenant
        made, seen by the probe, is no mark: a tenant may name its client's handle, RM's
        counter does not follow it; rs_server.c, ``_serverCreateEntryAndLockForNewClient``).
        Where client handles can be checked, a successor searches below the mark too: a process
        whose pod was configured after this daemon's first look, having started before its probe,
        is found there. Without checks it is not."""
        if not self._looked or self._active or self._stopped_short or self.own_mark is None:
            return self.mark
        return self.own_mark

    def advance(self, budget_s: float) -> None:
        """Run the searches for about ``budget_s`` in all, an equal part each (a process that
        started during a restart is not kept waiting behind an older one's long search); add
        what they find to the tracker."""
        share = budget_s / max(len(self._active), 1)
        for pid, active in list(self._active.items()):
            if not self._running(pid, active.started):
                # Its descriptors are closed; the search's copies alone would keep its RM
                # objects (and their GPU memory) alive.
                del self._active[pid]
                active.search.close()
                continue
            new = active.search.step(share)
            channels = sum(c.channels for c in new)
            if new:
                proc = discover.process_state(
                    pid,
                    self._cgroup_of(pid),
                    active.search.fds,
                    new,
                    incomplete=not active.search.done,
                )
                self._tracker().add_clients(proc)
            if channels:
                self.found_processes += 1
                self.found_channels += channels
                self.last_found_at = self._wall()
                self._forget_unseen(pid)
                log.info(
                    "pod %s: pid %d: its RM objects found by asking RM (%d channels, %d "
                    "controls in %.1f s); governed from now on",
                    active.pod,
                    pid,
                    channels,
                    active.search.asked,
                    self._clock() - active.since,
                )
            if active.search.done:
                self._finish(pid, active)
        if not self._active and isinstance(self._check, FreeClients):
            self._check.forget()  # a later search asks afresh

    def _finish(self, pid: int, active: _Active) -> None:
        del self._active[pid]
        self.asked += active.search.asked
        search = active.search
        tracker = self._tracker()
        known = tracker.processes.get(pid)
        if known is not None and known.incomplete and self._start_time(pid) == active.started:
            # Searched to the end: all there is to find is known (written so, for a next
            # daemon, which would otherwise search it again).
            known.incomplete = False
            tracker.changed("searched", known.cgroup, known)
        if any(c.channels for c in search.found):
            outcome = "found"
        else:
            outcome = f"no channels found ({search.error})" if search.error else "no channels found"
            log.warning(
                "pod %s: pid %d uses the GPU, but asking RM found none of its channels (%d "
                "controls%s): the rm enforcer cannot govern it; restart it, or use qgpu.ko",
                active.pod,
                pid,
                search.asked,
                f"; {search.error}" if search.error else "",
            )
        self._done[(pid, active.started)] = outcome

    def _forget_unseen(self, pid: int) -> None:
        self.unseen = {pod: [p for p in pids if p != pid] for pod, pids in self.unseen.items()}
        self.unseen = {pod: pids for pod, pids in self.unseen.items() if pids}

    def status(self) -> dict[str, Any]:
        return {
            # The looks through the pods' cgroups: how many the last listed, what it cost, and
            # how often they start (longer than LOOK_EVERY_S where a tenant's cgroups are many).
            "look": {
                "looks": self.looks,
                "cgroups": self.cgroups,
                "ms": round(self.look_cost_s * 1e3, 2),
                "every_s": round(self.look_every_s, 1),
                "spaced": self.look_every_s > LOOK_EVERY_S,
                "looking": self.looking,
            },
            "found_processes": self.found_processes,
            "found_channels": self.found_channels,
            "last_found_at": self.last_found_at,
            "controls": self.asked + sum(a.search.asked for a in self._active.values()),
            "searching": sorted(self._active),
            # Client handles checked by making a client at them (no log line), and refused
            # questions about one that may not exist (a log line each).
            "clients_checked": self._check.checked if isinstance(self._check, FreeClients) else 0,
            "refusals": self.refusals.spent,
            "not_found": sorted(
                pid for (pid, _), why in self._done.items() if why.startswith("no channels")
            ),
            # Not searched (see look()): without libcuda, or started before any daemon watched.
            "not_searched": sorted(
                pid for (pid, _), why in self._done.items() if why in ("no libcuda", "no mark")
            ),
        }

    def close(self) -> None:
        self._stopped_short = self._stopped_short or bool(self._active)
        for active in self._active.values():
            active.search.close()
        self._active.clear()
        self._look = None
        if isinstance(self._check, FreeClients):
            self._check.checker.close()
        self._check = None
