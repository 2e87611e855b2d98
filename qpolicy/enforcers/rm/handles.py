"""The RM handles of the node's GPU processes, kept on disk so that a restarted daemon governs the
processes that started before it.

The rm enforcer learns a process's clients, TSGs and channels from the RM_ALLOC traffic the
probe sees; RM cannot list them afterwards, only answer handle by handle, and only for the
clients made since a mark without flooding the kernel log (qpolicy/nvrm/discover.py). A daemon
that restarts (an upgrade, a crash, SIGKILL) would therefore leave every running pod ungoverned,
or searched for, until it knew them again. So the tracker's object trees are written here (at
most once a second, when they changed, and at shutdown), and the next daemon adopts them before
its probe's first events are read, for each process still alive with the same start time. The
file also keeps the mark, ``newest_client``: a client handle after which every client made, up
to the daemon's end, was seen made or searched for (qpolicy/enforcers/rm/unseen.py).

Nothing is taken on trust: each object is asked of RM (``GET_HANDLE_INFO``: its class, through
the tenant's own descriptor, which must still be an NVIDIA device) and kept only where RM still
holds that handle with that class; objects below one that is gone go with it. What a process
allocated while no daemon ran is not here (the probe saw none of it): the daemon searches RM for
it (qpolicy/enforcers/rm/unseen.py). A process written ``incomplete`` was being searched for
when the daemon stopped, and is searched again.

The file is read as untrusted input: a shape it does not expect is reported, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpolicy.enforcers.rm.record import process_start_time
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.abi import Node
from qpolicy.nvrm.tracker import Client, ProcessState, RmObject, Tracker

log = logging.getLogger(__name__)

HANDLES_NAME = "rm-handles.json"
VERSION = 1
#: How often, at most, the handles are written while they change (a CUDA process's start-up is
#: a few thousand allocations over a second or two; one write a second, not one per event).
WRITE_EVERY_S = 1.0
#: How often, at most, the file is written for a newer mark alone. Every look for unseen
#: processes (every 10 s) makes a client, so its own mark moves at each: 3 writes in 30 s for
#: that alone, where ten steady pods gave 6-9 in all (calls 55B-55D, H100s). A mark older than
#: the newest is still true (every client after it was seen made); the successor searches a few
#: more handles. A mark that goes back (a search started) or goes away is written within a second.
NEWER_MARK_EVERY_S = 60.0
#: The major number of NVIDIA's character devices (/dev/nvidiactl, /dev/nvidiaN).
NVIDIA_MAJOR = 195


#: The processes a file holds, each with the tracker's generation at its last change.
Processes = frozenset[tuple[int, int]]


def written_processes(tracker: Tracker) -> Iterator[tuple[int, ProcessState, list[Client]]]:
    """The processes the file holds, each with its clients on known files: those that have any
    (a client known only from objects seen under it has no file for a successor to borrow)."""
    for pid, proc in tracker.processes.items():
        clients = [c for c in proc.clients.values() if c.fd is not None]
        if pid is not None and clients:
            yield pid, proc, clients


def dump(
    tracker: Tracker, start_time: Callable[[int], int | None], mark: int | None = None
) -> dict[str, Any]:
    """The tracker's processes, as the file holds them: per process its start time, cgroup and
    files, and per client (on a known fd) its objects as [handle, class, parent, bytes, dup,
    info]; and ``mark``, below which the next daemon need not search RM."""
    processes = []
    for pid, proc, clients in written_processes(tracker):
        started = start_time(pid)
        if started is None:
            continue  # gone already
        processes.append(
            {
                "pid": pid,
                "start_time": started,
                "cgroup": proc.cgroup,
                "incomplete": proc.incomplete,
                "fds": {str(fd): node.value for fd, node in proc.fds.items()},
                "clients": [
                    {
                        "handle": client.handle,
                        "fd": client.fd,
                        "objects": [
                            [o.handle, o.cls, o.parent, o.bytes, int(o.dup), o.info]
                            for o in client.objects.values()
                        ],
                    }
                    for client in clients
                ],
            }
        )
    return {"version": VERSION, "newest_client": mark, "processes": processes}


class HandleBook:
    """Writes the tracker's handles to ``path`` when they changed, at most every
    :data:`WRITE_EVERY_S` (temp file and rename: a reader finds the old file or the new)."""

    def __init__(
        self,
        path: Path,
        tracker: Tracker,
        clock: Callable[[], float],
        start_time: Callable[[int], int | None] | None = None,
        mark: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.path = path
        self.tracker = tracker
        self._clock = clock
        self._start_time = start_time or (lambda pid: process_start_time(pid))
        #: The generation and mark last written, or looked at since and found nothing to write.
        self._written: tuple[int, int | None] | None = None
        #: What the file holds, in short: each process written and its last change, and the mark.
        self._held: tuple[Processes, int | None] | None = None
        self._written_at: float | None = None
        #: When a newer mark alone, put off, is written (None: nothing put off).
        self._due: float | None = None
        self._failed = False
        #: The mark to write, as it is now (the backend's: UnseenProcesses.mark_to_write).
        self._mark = mark
        #: Files written: each costs the loop a dump and an encode of every process's objects
        #: (about 0.1 % of a core once a second with 10 pods, BENCHMARKS.md 2026-12-07).
        self.writes = 0
        #: Why they were written: "tracker" (the processes or their objects changed), "mark"
        #: (only the mark), "first", "close".
        self.writes_why: Counter[str] = Counter()
        #: Times the tracker changed, or the mark, and the file was left as it was: only
        #: processes never written changed, and are gone (a monitoring agent's query of a
        #: second), or only the mark moved on, and its write was put off.
        self.unchanged = 0

    def _processes(self) -> Processes:
        """The processes :func:`dump` writes, each with its last change (cheap: no objects)."""
        return frozenset((pid, proc.changed_at) for pid, proc, _ in written_processes(self.tracker))

    def maybe_write(self) -> None:
        mark = self._mark()
        state = (self.tracker.generation, mark)
        if self._written == state and (self._due is None or self._clock() < self._due):
            return
        now = self._clock()
        since = None if self._written_at is None else now - self._written_at
        if since is not None and since < WRITE_EVERY_S:
            return
        why, processes = "first", None
        if self._held is not None and since is not None:
            processes = self._processes()
            if processes != self._held[0]:
                why = "tracker"
            elif mark == self._held[1]:
                self._written, self._due = state, None
                self.unchanged += 1
                return
            else:
                old = self._held[1]
                newer = mark is not None and old is not None and mark > old
                if newer and since < NEWER_MARK_EVERY_S:
                    # The file's mark is still true: it goes with the next change, or when due;
                    # until then nothing is looked at again.
                    self._written, self._due = state, now - since + NEWER_MARK_EVERY_S
                    self.unchanged += 1
                    return
                why = "mark"
        self.write(why, processes)

    def write(self, why: str = "close", processes: Processes | None = None) -> None:
        """Write the file now; ``processes``: :meth:`_processes`, where the caller has it."""
        written = (self.tracker.generation, self._mark())
        held = (self._processes() if processes is None else processes, written[1])
        self._written_at = self._clock()
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(dump(self.tracker, self._start_time, written[1])))
            os.replace(tmp, self.path)
        except OSError as error:
            if not self._failed:  # once: a full disk would otherwise log every second
                log.warning("cannot write %s: %s; a restarted daemon will not know the "
                            "processes running now", self.path, error)  # fmt: skip
            self._failed = True
            return
        self._failed = False
        self._written, self._held, self._due = written, held, None
        self.writes += 1
        self.writes_why[why] += 1


@dataclass(frozen=True, slots=True)
class Adoption:
    """What :func:`adopt` took over from a previous daemon, and what it could not."""

    processes: int = 0
    channels: int = 0
    objects: int = 0
    #: Objects RM no longer holds as they were written (freed, or the handle reused).
    dropped: int = 0
    problems: tuple[str, ...] = ()
    #: The previous daemon's mark (None: no file, or none written).
    newest_client: int | None = None


def adopt(
    state_dir: Path,
    tracker: Tracker,
    cgroup_of: Callable[[int], int | None],
    *,
    borrow: Callable[[int, int], int] | None = None,
    class_of: Callable[[int, int, int], int | None] | None = None,
    start_time: Callable[[int], int | None] | None = None,
    is_nvidia: Callable[[int], bool] | None = None,
) -> Adoption:
    """Give ``tracker`` the processes a previous daemon knew, where they still live and RM still
    holds their objects. Run at start-up, before the probe's first events are fed: those come
    after, and apply on top. ``cgroup_of`` gives a process's cgroup id now; the other callables
    stand in for the kernel and RM in tests (default: pidfd_getfd, ``GET_HANDLE_INFO``,
    /proc/PID/stat, fstat)."""
    path = state_dir / HANDLES_NAME
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return Adoption()
    except (OSError, ValueError) as error:
        return Adoption(problems=(f"cannot read {path}: {error}",))
    if not isinstance(document, dict) or document.get("version") != VERSION:
        return Adoption(problems=(f"{path}: not a handle file this qpolicy wrote",))
    entries = document.get("processes")
    if not isinstance(entries, list):
        return Adoption(problems=(f"{path}: not a handle file this qpolicy wrote",))
    mark = document.get("newest_client")
    newest_client = mark if isinstance(mark, int) and not isinstance(mark, bool) else None
    check = is_nvidia or _is_nvidia
    borrow = borrow or rmctl.borrow_fd
    class_of = class_of or rmctl.handle_class
    start_time = start_time or process_start_time
    processes = channels = objects = dropped = 0
    problems: list[str] = []
    for entry in entries:
        try:
            proc, gone = _adopt_one(entry, borrow, class_of, start_time, check, cgroup_of)
        except (KeyError, TypeError, ValueError) as error:
            problems.append(f"{path}: malformed entry ({error!r})")
            continue
        except rmctl.RmError as error:
            problems.append(f"pid {entry.get('pid')}: {error}")
            continue
        dropped += gone
        if proc is None:
            continue
        tracker.adopt(proc)
        processes += 1
        objects += sum(len(c.objects) for c in proc.clients.values())
        channels += len(proc.objects(abi.Kind.CHANNEL))
    return Adoption(processes, channels, objects, dropped, tuple(problems), newest_client)


def _adopt_one(
    entry: Mapping[str, Any],
    borrow: Callable[[int, int], int],
    class_of: Callable[[int, int, int], int | None],
    start_time: Callable[[int], int | None],
    is_nvidia: Callable[[int], bool],
    cgroup_of: Callable[[int], int | None],
) -> tuple[ProcessState | None, int]:
    """The process ``entry`` names, with what RM still holds of it (None: it is gone, or holds
    nothing written), and how many of its objects were dropped."""
    pid = _int(entry["pid"])
    written_start = _int(entry["start_time"])
    if start_time(pid) != written_start:
        return None, 0  # exited, or its pid reused
    proc = ProcessState(pid, incomplete=bool(entry.get("incomplete", False)))
    cgroup = cgroup_of(pid)
    proc.cgroup = cgroup if cgroup is not None else _optional_int(entry.get("cgroup"))
    # JSON's keys are strings.
    proc.fds = {int(str(fd)): Node(node) for fd, node in dict(entry.get("fds", {})).items()}
    dropped = 0
    for written in entry["clients"]:
        handle, fd = _int(written["handle"]), _int(written["fd"])
        rows = [_object(handle, row) for row in written["objects"]]
        try:
            mine = borrow(pid, fd)
        except rmctl.RmError:
            dropped += len(rows)  # the file is closed, and the client with it
            continue
        try:
            if not is_nvidia(mine):
                dropped += len(rows)  # the fd number now names another file
                continue
            kept = {
                obj.handle: obj for obj in rows if class_of(mine, handle, obj.handle) == obj.cls
            }
        finally:
            os.close(mine)
        kept = _connected(kept, {obj.handle for obj in rows})
        dropped += len(rows) - len(kept)
        if handle in kept:
            proc.clients[handle] = Client(handle, fd, kept)
    return (proc if proc.clients else None), dropped


def _connected(kept: dict[int, RmObject], written: set[int]) -> dict[int, RmObject]:
    """``kept`` without the objects below one that was written and is gone (freed, and the
    handles below it with it: RM frees a subtree)."""
    result = dict(kept)
    changed = True
    while changed:
        changed = False
        for handle, obj in list(result.items()):
            parent = obj.parent
            orphan = parent is not None and parent in written and parent not in result
            if orphan and parent != handle:
                del result[handle]
                changed = True
    return result


def _object(client: int, row: Any) -> RmObject:
    handle, cls, parent, size, dup, info = row
    obj = RmObject(
        client,
        _int(handle),
        _int(cls),
        abi.class_kind(_int(cls)),
        _optional_int(parent),
        bytes=_int(size),
        dup=bool(dup),
    )
    obj.info = {str(k): _int(v) for k, v in dict(info).items()}
    return obj


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, found {value!r}")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _is_nvidia(fd: int) -> bool:
    """Whether ``fd`` is an NVIDIA character device (a tenant's fd number may have been reused
    for another file while no daemon ran)."""
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISCHR(info.st_mode) and os.major(info.st_rdev) == NVIDIA_MAJOR
