"""Cgroup v2 ids and paths: what ``bpf_get_current_cgroup_id()`` returns, and what people read.

The id of a cgroup v2 is the inode number of its directory in the cgroup2 mount. The mount is
found in ``/proc/self/mounts`` (``/sys/fs/cgroup`` on unified hosts, ``/sys/fs/cgroup/unified``
on hybrid ones); paths are relative to it and start with ``/`` (``/kubepods.slice/pod-x``).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from qpolicy.errors import QPolicyError
from qpolicy.runtime import fhandle
from qpolicy.runtime.dirtree import directories

log = logging.getLogger(__name__)

PROC_MOUNTS = Path("/proc/self/mounts")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Where a cgroup cannot be opened by its id, an unknown id walks the hierarchy: at most every
#: ``REFRESH_MIN_S``, and spaced so that the walks take at most ``WALK_SHARE`` of a core. A
#: tenant chooses how many cgroups there are, and how often a GPU process starts in a new one:
#: a walk of a tenant's 5 450 cgroups cost 184-293 ms (BENCHMARKS.md, 2026-12-07, fifty-ninth
#: session), twice a second without the spacing.
REFRESH_MIN_S = 0.5
WALK_SHARE = 0.01
#: open_by_handle_at's answers for an id that names no directory on the mount: no such kernfs
#: node (removed, or never was; fs/kernfs/mount.c, __kernfs_fh_to_dentry), or a file's.
_GONE = {errno.ESTALE, errno.ENOENT, errno.ENOTDIR}


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


def _cgroup_path(directory: str, root: str) -> str | None:
    """The cgroup path (``/a/b``) of ``directory`` under the mount ``root``; None outside it."""
    rel = os.path.relpath(directory, root)
    if rel == ".." or rel.startswith("../"):
        return None
    return "/" if rel == "." else "/" + rel


class OpensById(Protocol):
    """:class:`CgroupsById`'s interface (tests stand in for the kernel's answers)."""

    def path_of(self, cgid: int) -> str | None: ...

    def close(self) -> None: ...


class CgroupsById:
    """Opens a cgroup by its id and reads its path back: a few system calls (20 us), however
    many cgroups there are. A cgroup v2 directory's file handle is its kernfs node id, the
    cgroup's id (:mod:`qpolicy.runtime.fhandle`)."""

    def __init__(self, root: Path, mount_fd: int) -> None:
        self.root = root
        self._mount_fd = mount_fd

    @classmethod
    def open(cls, root: Path) -> CgroupsById | None:
        """None where cgroups under ``root`` cannot be opened by id: not a cgroup2 mount (a
        test's directory), a kernel before FILEID_KERNFS (5.5), or no CAP_DAC_READ_SEARCH."""
        try:
            kind, _ = fhandle.handle_of(str(root))
            if kind != fhandle.FILEID_KERNFS:
                return None
            mount_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        ids = cls(root, mount_fd)
        try:
            # Opening by handle is what needs the capability: tried on the root's own id.
            usable = ids.path_of(os.fstat(mount_fd).st_ino) == "/"
        except OSError:
            usable = False
        if not usable:
            ids.close()
            return None
        return ids

    def path_of(self, cgid: int) -> str | None:
        """``cgid``'s path under the root; None where no cgroup has that id (removed, or never
        was) or it lies outside the root. OSError where it could not be asked."""
        if not 0 < cgid < 1 << 64:
            return None  # no kernfs node id
        try:
            fd = fhandle.open_by_handle(
                self._mount_fd,
                fhandle.FILEID_KERNFS,
                fhandle.kernfs_handle(cgid),
                os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
            )
        except OSError as error:
            if error.errno in _GONE:
                return None
            raise
        try:
            if os.fstat(fd).st_ino != cgid:
                return None
            target = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        if target.endswith(" (deleted)"):
            return None  # removed while it was opened
        return _cgroup_path(target, str(self.root))

    def close(self) -> None:
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1


class CgroupMap:
    """Cgroup id <-> path, cached. An unknown id is opened by its id (:class:`CgroupsById`), or
    where that cannot be done, found by walking the hierarchy again (at most every
    ``REFRESH_MIN_S``, spaced to ``WALK_SHARE`` of a core). Ids are never reused, so paths of
    removed cgroups stay known."""

    def __init__(
        self,
        root: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        timer: Callable[[], float] = time.perf_counter,
        by_id: Callable[[Path], OpensById | None] = CgroupsById.open,
    ) -> None:
        self.root = root if root is not None else cgroup2_mount()
        self._clock = clock
        # Measures what a walk cost (``clock`` spaces the walks).
        self._timer = timer
        self._open_by_id = by_id
        self._by_id: OpensById | None = None
        self._by_id_tried = False
        self._paths: dict[int, str] = {}
        self._walked_at: float | None = None
        #: What the last walk cost (s of the timer); how many walks and opens by id there were.
        self.walk_cost_s = 0.0
        self.walks = 0
        self.opened = 0

    @property
    def walk_every_s(self) -> float:
        return max(REFRESH_MIN_S, self.walk_cost_s / WALK_SHARE)

    @property
    def by_id(self) -> bool:
        """Whether unknown ids are opened by id rather than walked for."""
        return self._ids() is not None

    def _ids(self) -> OpensById | None:
        if not self._by_id_tried:
            self._by_id_tried = True
            self._by_id = self._open_by_id(self.root)
        return self._by_id

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
        ids = self._ids()
        if ids is not None:
            try:
                path = ids.path_of(cgid)
            except OSError as error:
                # Not gone, not asked (out of descriptors, say): the walk, spaced, will do.
                log.debug("cgroup id %d could not be opened: %s", cgid, error)
            else:
                self.opened += 1
                if path is not None:
                    self._paths[cgid] = path
                return path
        now = self._clock()
        if self._walked_at is None or now - self._walked_at >= self.walk_every_s:
            self.refresh()
        return self._paths.get(cgid)

    def refresh(self) -> None:
        self._walked_at = self._clock()
        started = self._timer()
        self._walk()
        self.walk_cost_s = self._timer() - started
        self.walks += 1

    def close(self) -> None:
        if self._by_id is not None:
            self._by_id.close()
        self._by_id, self._by_id_tried = None, False

    def _walk(self) -> None:
        root = str(self.root)
        for directory in directories(root):
            try:
                cgid = os.stat(directory).st_ino
            except OSError:
                continue  # removed while we walked
            path = _cgroup_path(directory, root)
            if path is not None:
                self._paths[cgid] = path
