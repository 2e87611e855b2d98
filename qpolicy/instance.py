"""One daemon per node: an exclusive lock in the state directory, naming its holder.

Two daemons would undo each other's work: the second re-opens the first one's closed channels as
it recovers, and deletes its record. The lock is taken before anything else (recovery included),
held for the daemon's life and released by the kernel when the process dies, however it dies, so
a stale lock cannot outlive its daemon. The holder's pid is written into the lock file for the
message a second daemon prints and for ``qpolicy status``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from qpolicy.errors import QPolicyError

LOCK_NAME = "daemon.lock"
# What the running daemon publishes for `qpolicy status`, next to its lock.
STATUS_NAME = "daemon-status.json"


class InstanceLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise QPolicyError naming who holds it."""
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise QPolicyError(f"cannot open {self.path}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise QPolicyError(f"cannot lock {self.path}: {error.strerror}") from None
            holder = holder_of(self.path)
            who = f"pid {holder}" if holder is not None else "another process"
            raise QPolicyError(
                f"another qpolicy daemon ({who}) is running on this node: it holds {self.path}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def holder_of(path: Path) -> int | None:
    """The pid written in a lock file, if it parses."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isascii() or not text.isdigit():
        return None  # "²" is a digit to isdigit, not to int
    try:
        return int(text)
    except ValueError:  # more digits than Python converts: no pid
        return None


def running_daemon(state_dir: Path) -> int | None:
    """The pid of the daemon holding ``state_dir``'s lock, or None if none holds it."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return holder_of(path)  # held: a daemon runs
    finally:
        os.close(fd)
    return None
