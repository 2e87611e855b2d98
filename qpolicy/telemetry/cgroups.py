"""Cgroup v2 ids and paths: what ``bpf_get_current_cgroup_id()`` returns, and what people read.

The id of a cgroup v2 is the inode number of its directory in the cgroup2 mount. The mount is
found in ``/proc/self/mounts`` (``/sys/fs/cgroup`` on unified hosts, ``/sys/fs/cgroup/unified``
on hybrid ones); paths are relative to it and start with ``/`` (``/kubepods.slice/pod-x``).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from qpolicy.errors import QPolicyError
from qpolicy.runtime.dirtree import directories

PROC_MOUNTS = Path("/proc/self/mounts")
CGROUP_ROOT = Path("/sys/fs/cgroup")
REFRESH_MIN_S = 0.5


class CgroupError(QPolicyError):
    """No cgroup v2 hierarchy is mounted, or a cgroup path does not exist."""


def _unescape(field: str) -> str:
    # /proc/self/mounts writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_mount(mounts: str | None = None) -> Path:
    """Where the cgroup v2 hierarchy is mounted (``mounts``: /proc/self/mounts text)."""
    if mounts is None:
        try:
            mounts = PROC_MOUNTS.read_text()
        except OSError as error:
            raise CgroupError(f"cannot read {PROC_MOUNTS}: {error.strerror}") from None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(_unescape(fields[1]))
    raise CgroupError("no cgroup v2 hierarchy is mounted (the probe keys everything by it)")


def normalize(path: str) -> str:
    """``/a/b`` form: one leading slash, none trailing, no empty or ``.`` parts."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise CgroupError(f"cgroup path {path!r} must not contain '..'")
    return "/" + "/".join(parts)


def within(path: str, ancestor: str) -> bool:
    """Whether cgroup ``path`` is ``ancestor`` or below it (both normalized)."""
    return ancestor == "/" or path == ancestor or path.startswith(ancestor + "/")


def cgroup_id(path: str | os.PathLike[str], root: Path = CGROUP_ROOT) -> int:
    """The id of a cgroup v2 (as the kernel and qgpu.ko know it): its directory's inode number.

    ``path`` is the cgroup's directory, or its path in the hierarchy (``/kubepods.slice/x`` or
    ``kubepods.slice/x``), taken relative to ``root``.
    """
    directory = Path(path)
    if not (directory.is_absolute() and directory.is_relative_to(root)):
        directory = root / normalize(str(path)).lstrip("/")
    try:
        info = os.stat(directory)
    except OSError as error:
        raise CgroupError(f"cgroup {str(path)!r}: {error.strerror} ({directory})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CgroupError(f"cgroup {str(path)!r}: {directory} is not a directory")
    return info.st_ino


def cgroup_of_process(pid: int, root: Path, proc: Path = Path("/proc")) -> int | None:
    """The id of the cgroup v2 ``pid`` is in now (``0::/path`` of ``/proc/PID/cgroup``, under the
    cgroup2 mount ``root``), or None where the process or its cgroup is gone."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            try:
                return cgroup_id(line[3:], root)
            except CgroupError:
                return None
    return None


class CgroupMap:
    """Cgroup id <-> path, cached; an unknown id walks the hierarchy again (at most every
    ``REFRESH_MIN_S``). Ids are never reused, so paths of removed cgroups stay known."""

    def __init__(
        self,
        root: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root if root is not None else cgroup2_mount()
        self._clock = clock
        self._paths: dict[int, str] = {}
        self._walked_at: float | None = None

    def id_of(self, path: str) -> int:
        rel = normalize(path)
        try:
            cgid = os.stat(self.root / rel.lstrip("/")).st_ino
        except OSError as error:
            raise CgroupError(f"cgroup {rel!r}: {error.strerror} (under {self.root})") from None
        self._paths[cgid] = rel
        return cgid

    def known_path(self, cgid: int) -> str | None:
        """The path of ``cgid`` if known already; never walks (for what is only shown)."""
        return self._paths.get(cgid)

    def path_of(self, cgid: int) -> str | None:
        found = self._paths.get(cgid)
        if found is not None:
            return found
        now = self._clock()
        if self._walked_at is None or now - self._walked_at >= REFRESH_MIN_S:
            self.refresh()
        return self._paths.get(cgid)

    def refresh(self) -> None:
        self._walked_at = self._clock()
        root = str(self.root)
        for directory in directories(root):
            try:
                cgid = os.stat(directory).st_ino
            except OSError:
                continue  # removed while we walked
            rel = os.path.relpath(directory, root)
            self._paths[cgid] = "/" if rel == "." else "/" + rel
