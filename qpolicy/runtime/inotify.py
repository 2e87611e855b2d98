"""inotify(7) through libc, non-blocking: Python's standard library has no binding.

Only what the daemon's watch of the cgroup hierarchy needs (qpolicy.desired.annotationwatch): an
instance, watches added and removed, and the events that arrived, read without waiting.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass

from qpolicy.runtime.libc import libc

# <sys/inotify.h>
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name.
_HEADER = struct.Struct("=iIII")
# Room for many events a read; an event is at most the header and NAME_MAX + 1 bytes.
_READ_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Event:
    wd: int
    mask: int
    cookie: int
    name: str  # the entry's name within a watched directory; "" for the directory itself


def parse(buffer: bytes) -> list[Event]:
    """The events in what one read(2) of an inotify descriptor returned (whole events only:
    the kernel never splits one across reads)."""
    events = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        wd, mask, cookie, length = _HEADER.unpack_from(buffer, offset)
        offset += _HEADER.size
        raw = buffer[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        events.append(Event(wd, mask, cookie, os.fsdecode(raw)))
    return events


class Inotify:
    """One inotify instance. Raises OSError where the kernel refuses one (EMFILE: the user's
    ``fs.inotify.max_user_instances`` are taken) or a watch (ENOSPC: ``max_user_watches``)."""

    def __init__(self) -> None:
        fd = libc().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self._fd: int | None = fd

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("the inotify instance is closed")
        return self._fd

    def add(self, path: str, mask: int) -> int:
        """Watches ``path`` for ``mask``; the watch descriptor (the same one again for an inode
        already watched)."""
        wd = libc().inotify_add_watch(self.fileno(), os.fsencode(path), ctypes.c_uint32(mask))
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return int(wd)

    def remove(self, wd: int) -> None:
        """Stops a watch; one the kernel already dropped (its inode gone) is no error."""
        libc().inotify_rm_watch(self.fileno(), wd)

    def read_some(self) -> list[Event]:
        """The events one read(2) returns (up to 64 KiB of them), without waiting; the rest
        stay queued in the kernel, where a reader that falls behind sees ``IN_Q_OVERFLOW``
        once ``fs.inotify.max_queued_events`` are waiting."""
        while True:
            try:
                return parse(os.read(self.fileno(), _READ_BYTES))
            except BlockingIOError:
                return []
            except InterruptedError:
                continue

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
