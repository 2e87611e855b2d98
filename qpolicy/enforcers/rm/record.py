"""What the rm enforcer changed on tenants' objects, on disk, so that a daemon killed with SIGKILL
does not leave it changed.

Three kinds of change outlive the daemon that made them: channel groups it closed
(``FIFO_DISABLE_CHANNELS``), TSG timeslices it set (``SET_TIMESLICE``) and contexts' compute
preemption modes it set (``GR_SET_CTXSW_PREEMPTION_MODE``, under the CTA strategy; a record
without them, as daemons before it wrote, reads as none). Each is written down
(temp file and rename) before it is made, with the process's start time so that a reused pid is
never mistaken for the tenant; :func:`recover` undoes all of it at the next start, before anything
else is sent. Written before, not after: a daemon killed between a close and its write would leave
a group closed that no record names. A group listed but not closed (its close refused, or opened
since) costs nothing to recover: GSP counts closes, and an open of a channel not closed does
nothing (an H200: tools/gpu/disable_nesting.py). So a group opened again stays listed until the
next write, and a turn switch costs no write once the turns have come round. The file is not
fsynced: it only matters while the processes it names live, and they do not outlive the machine.

The file names the daemon that wrote it (pid and start time): its guard (:mod:`~.guard`), which
undoes it the moment that daemon dies, leaves alone a record a successor wrote. The next daemon
undoes any. Both take :data:`LOCK_NAME` to do so.

The file is read as untrusted input: a shape it does not expect is reported, never raised.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qpolicy.nvrm import rmctl
from qpolicy.nvrm.tracker import ClientChannels

log = logging.getLogger(__name__)

RECORD_NAME = "rm-record.json"
# What daemons before the record kept timeslices wrote: closed channel groups only.
LEGACY_RECORD_NAME = "rm-disabled.json"
# Held while a record is undone: by the next daemon at its start, by the guard at a death.
LOCK_NAME = "rm-record.lock"
VERSION = 2


def parse_stat(text: bytes) -> tuple[str, int, int] | None:
    """State letter, flags and start time (clock ticks since boot) from the text of a
    /proc/PID/stat or /proc/PID/task/TID/stat: the fields after the last ')', since a process
    names itself (its comm may hold any byte, a ')' too)."""
    try:
        fields = text.rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[6]), int(fields[19])
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """``pid``'s state letter and start time, from /proc/PID/stat."""
    try:
        parsed = parse_stat(Path(f"/proc/{pid}/stat").read_bytes())
    except OSError:
        return None
    return None if parsed is None else (parsed[0], parsed[2])


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), to tell a pid from its reuse."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def process_running(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` and has not exited (a
    zombie has closed its files: a copy of one of them is all that keeps its RM objects)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == started


def group_key(group: ClientChannels) -> str:
    return f"{group.pid}:{group.fd}:{group.client:#x}:{group.subdevice or 0:#x}"


def tsg_key(pid: int, client: int, tsg: int) -> str:
    return f"{pid}:{client:#x}:{tsg:#x}"


def channel_key(pid: int, client: int, channel: int) -> str:
    return f"{pid}:{client:#x}:{channel:#x}"


@dataclass
class RmRecord:
    """The closed channel groups, changed timeslices and preemption modes, kept in ``path``."""

    path: Path
    closed: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeslices: dict[str, dict[str, Any]] = field(default_factory=dict)
    preemptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Per pid, its start time (read once from /proc: a turn switch writes the record each time).
    _start_times: dict[int, int | None] = field(default_factory=dict)
    # The closed groups the file lists: those closed now, and those opened since it was written.
    _listed: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The daemon that writes it (this process), for its guard.
    _writer: dict[str, int | None] = field(default_factory=dict)

    def _start_time(self, pid: int) -> int | None:
        if pid not in self._start_times:
            self._start_times[pid] = process_start_time(pid)
        return self._start_times[pid]

    def closing(self, group: ClientChannels) -> None:
        """Called before ``group`` is closed: once this returns, a daemon killed at any point
        leaves a record that opens it again."""
        with self._lock:
            key = group_key(group)
            entry = {
                "pid": group.pid,
                "start_time": self._start_time(group.pid) if group.pid else None,
                "fd": group.fd,
                "client": group.client,
                "subdevice": group.subdevice,
                "channels": list(group.channels),
            }
            self.closed[key] = entry
            # Still in the file since it was last closed: nothing to write (turns come round).
            if self._listed.get(key) != entry:
                self._write()

    def channels_opened(self, group: ClientChannels) -> None:
        """Called once ``group`` is open again, or its close was refused (rmctl opened whatever
        of it was sent). The file is written only once nothing is closed: until the next write
        it may list a group opened since, which :func:`recover` would open again, harmlessly.
        A turn switch (one group closed, one opened) then writes nothing once the turns have
        come round."""
        with self._lock:
            if self.closed.pop(group_key(group), None) is not None and not self.closed:
                self._write()

    def timeslice_changed(self, pid: int, fd: int, client: int, tsg: int, original: int) -> None:
        """Called before a TSG's timeslice is first changed, and again when its tenant set its own
        since, with the value to restore."""
        with self._lock:
            key = tsg_key(pid, client, tsg)
            # Written again only if the value to restore changed (the tenant set its own since).
            if self.timeslices.get(key, {}).get("original_us") == original:
                return
            self.timeslices[key] = {
                "pid": pid,
                "start_time": self._start_time(pid),
                "fd": fd,
                "client": client,
                "tsg": tsg,
                "original_us": original,
            }
            self._write()

    def timeslice_restored(self, pid: int, client: int, tsg: int) -> None:
        with self._lock:
            if self.timeslices.pop(tsg_key(pid, client, tsg), None) is not None:
                self._write()

    def preemption_changed(
        self, pid: int, fd: int, client: int, subdevice: int, channel: int, original: int
    ) -> None:
        """Called before a channel's compute preemption mode is first changed, with the mode to
        restore."""
        with self._lock:
            key = channel_key(pid, client, channel)
            if self.preemptions.get(key, {}).get("original_mode") == original:
                return
            self.preemptions[key] = {
                "pid": pid,
                "start_time": self._start_time(pid),
                "fd": fd,
                "client": client,
                "subdevice": subdevice,
                "channel": channel,
                "original_mode": original,
            }
            self._write()

    def preemption_restored(self, pid: int, client: int, channel: int) -> None:
        with self._lock:
            if self.preemptions.pop(channel_key(pid, client, channel), None) is not None:
                self._write()

    def forget(self, pid: int) -> None:
        """The process exited: what it held went with it."""
        with self._lock:
            self._start_times.pop(pid, None)
            before = self._size()
            for table in (self.closed, self.timeslices, self.preemptions):
                for key in [k for k, entry in table.items() if entry.get("pid") == pid]:
                    del table[key]
            listed = any(entry.get("pid") == pid for entry in self._listed.values())
            if listed or self._size() != before:
                self._write()

    def _size(self) -> int:
        return len(self.closed) + len(self.timeslices) + len(self.preemptions)

    def _write(self) -> None:
        self._listed = dict(self.closed)
        if not self._size():
            self.path.unlink(missing_ok=True)  # nothing to undo
            return
        if not self._writer:
            pid = os.getpid()
            self._writer = {"pid": pid, "start_time": process_start_time(pid)}
        tmp = self.path.with_suffix(".tmp")
        document = {
            "version": VERSION,
            "writer": self._writer,
            "closed": self.closed,
            "timeslices": self.timeslices,
            "preemptions": self.preemptions,
        }
        tmp.write_text(json.dumps(document))
        os.replace(tmp, self.path)


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :func:`recover` undid, and what it could not."""

    opened: int = 0
    restored: int = 0
    problems: tuple[str, ...] = ()
    #: Compute preemption modes given back.
    modes: int = 0


def recover(
    state_dir: Path,
    borrow: Callable[[int, int], int] | None = None,
    *,
    writer: tuple[int, int] | None = None,
) -> Recovery:
    """Undo what a previous daemon left changed: open its closed channel groups and restore the
    timeslices it set, for the processes still alive. Run at start-up, before anything else is
    sent, and by a dead daemon's guard with ``writer`` (its pid and start time): then only a
    record that daemon wrote is undone. The record is removed afterwards, whatever could be
    undone. The two never undo at once (:data:`LOCK_NAME`).
    """
    borrow = borrow or rmctl.borrow_fd  # looked up now: tests stand in for pidfd_getfd
    try:
        lock = open(state_dir / LOCK_NAME, "a")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return Recovery()  # no state directory: nothing was recorded
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _recover(state_dir, borrow, writer)


def _recover(
    state_dir: Path, borrow: Callable[[int, int], int], writer: tuple[int, int] | None
) -> Recovery:
    opened = restored = modes = 0
    problems: list[str] = []
    paths = [state_dir / RECORD_NAME]
    if writer is None:
        paths.append(state_dir / LEGACY_RECORD_NAME)
    for path in paths:
        read = _read(path, writer)
        if read.another_writer:
            continue  # another daemon's: not the guard's to undo
        if read.problem is not None:
            problems.append(read.problem)
        for key, entry in read.closed.items():
            problem = _undo(entry, ("fd", "client", "subdevice"), borrow, _open_channels)
            if problem is None:
                opened += 1
            elif problem:
                problems.append(f"{key}: {problem}")
        for key, entry in read.timeslices.items():
            problem = _undo(entry, ("fd", "client", "tsg", "original_us"), borrow, _restore_slice)
            if problem is None:
                restored += 1
            elif problem:
                problems.append(f"{key}: {problem}")
        for key, entry in read.preemptions.items():
            needed = ("fd", "client", "subdevice", "channel", "original_mode")
            problem = _undo(entry, needed, borrow, _restore_mode)
            if problem is None:
                modes += 1
            elif problem:
                problems.append(f"{key}: {problem}")
        path.unlink(missing_ok=True)
    return Recovery(opened, restored, tuple(problems), modes)


@dataclass(frozen=True)
class _Read:
    """What one record file holds for a recovery."""

    closed: Mapping[str, Any] = field(default_factory=dict)
    timeslices: Mapping[str, Any] = field(default_factory=dict)
    preemptions: Mapping[str, Any] = field(default_factory=dict)
    #: Why the file could not be used (None: it could, or there is none).
    problem: str | None = None
    #: Written by another daemon than the one recovered for: left alone, no problem.
    another_writer: bool = False


def _read(path: Path, writer: tuple[int, int] | None = None) -> _Read:
    """The record's closed groups and timeslices, or why they cannot be used."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return _Read()
    except (OSError, ValueError) as error:
        return _Read(problem=f"cannot read {path}: {error}")
    if not isinstance(document, dict):
        return _Read(problem=f"{path}: expected a JSON object, found {type(document).__name__}")
    if path.name == LEGACY_RECORD_NAME:
        return _Read(closed=document)
    closed, timeslices = document.get("closed", {}), document.get("timeslices", {})
    preemptions = document.get("preemptions", {})
    if document.get("version") != VERSION or not (
        isinstance(closed, dict) and isinstance(timeslices, dict) and isinstance(preemptions, dict)
    ):
        return _Read(problem=f"{path}: not a record this qpolicy wrote (version {VERSION})")
    if writer is not None:
        wrote = document.get("writer")
        if not isinstance(wrote, dict) or (wrote.get("pid"), wrote.get("start_time")) != writer:
            return _Read(another_writer=True)
    return _Read(closed, timeslices, preemptions)


def _undo(
    entry: object,
    needed: tuple[str, ...],
    borrow: Callable[[int, int], int],
    action: Callable[[int, dict[str, Any]], rmctl.ControlResult],
) -> str | None:
    """None when undone; "" when there was nothing to undo (the process is gone); else why not."""
    if not isinstance(entry, dict):
        return "malformed entry"
    pid = entry.get("pid")
    if type(pid) is not int or any(type(entry.get(k)) is not int for k in needed):
        return "malformed entry"
    if process_start_time(pid) != entry.get("start_time"):
        return ""  # the process is gone: what it held went with it
    try:
        fd = borrow(pid, entry["fd"])
        try:
            result = action(fd, entry)
        finally:
            os.close(fd)
    except (rmctl.RmError, ValueError, TypeError) as error:
        return str(error)
    return None if result.ok else f"RM status {result.status:#x}"


def _open_channels(fd: int, entry: dict[str, Any]) -> rmctl.ControlResult:
    channels = entry.get("channels")
    if not isinstance(channels, list) or not all(type(c) is int for c in channels):
        raise ValueError("malformed channel list")
    return rmctl.disable_channels(fd, entry["client"], entry["subdevice"], channels, disable=False)


def _restore_slice(fd: int, entry: dict[str, Any]) -> rmctl.ControlResult:
    return rmctl.set_timeslice(fd, entry["client"], entry["tsg"], entry["original_us"])


def _restore_mode(fd: int, entry: dict[str, Any]) -> rmctl.ControlResult:
    return rmctl.set_compute_preemption(
        fd, entry["client"], entry["subdevice"], entry["channel"], entry["original_mode"]
    )
