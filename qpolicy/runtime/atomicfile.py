"""A file replaced whole or not at all: the state file, the daemon's status, the doctor's cache.

Each is read by other processes (``qpolicy status``, the daemon, users' tools) while it is being
rewritten, so a reader must see the old version or the new one, never half of one: the data goes
to a temporary file beside the target and is renamed over it. A write that fails (a full disk, a
signal) leaves neither a half-written target nor the temporary file: the daemon's status is
written every second, and each failure used to leave one more ``.status.*.tmp`` behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, *, prefix: str, durable: bool = False) -> None:
    """Replace ``path`` with ``data``, world-readable (mkstemp makes the file 0600; the daemon
    and other users' ``qpolicy status`` read these files). ``prefix`` names the temporary file
    (``.state.``), so one left by a crash of the machine says whose it is. ``durable``: synced
    to disk, file and directory, so that a power cut leaves the old version or the new one (the
    rename lives in the directory: without its sync the old file may come back). Raises what
    the write raised, with nothing left behind."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fchmod(file.fileno(), 0o644)
            if durable:
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
