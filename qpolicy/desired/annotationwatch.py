"""Cgroup annotations kept current by inotify instead of a walk of the hierarchy every second.

A walk lists every entry of every cgroup directory, and each has dozens of control files: on a
tree shaped like a Kubernetes node's with 100 pods (437 directories of 60 entries each, on
tmpfs) one walk took 18 ms, 1.8 % of a core at one walk a second (`make bench`'s annotations
row, BENCHMARKS.md 2026-12-07), against the daemon's 2 % target for all it does. The hierarchy is
walked once, watching each directory, and then only what inotify reports is read again:

* a directory created or moved in (``IN_CREATE``/``IN_MOVED_TO`` with ``IN_ISDIR``, from
  vfs_mkdir/vfs_rename's fsnotify calls, which cgroupfs's mkdir and rename go through): its
  subtree is watched and read, watch first, so a child made meanwhile is either seen by the
  walk or reported;
* an attribute written on a directory (``IN_ATTRIB`` on its own watch: vfs_setxattr and
  vfs_removexattr notify): that directory's annotations are read again;
* a directory removed or renamed (``IN_DELETE``/``IN_MOVED_FROM`` on its parent): its
  subtree's pods are dropped (a rename then comes in as ``IN_MOVED_TO`` under its new name,
  and its watches, the same inodes', are given the new paths);
* the queue overflowed (``IN_Q_OVERFLOW``): the hierarchy is walked again.

Writes to control files (``cgroup.procs``, ``cgroup.events``) are not in the mask and wake
nothing. Every ``RESCAN_EVERY_S`` the hierarchy is walked again anyway, so that a missed event
costs at most that long. Where inotify refuses (``fs.inotify.max_user_instances`` or
``max_user_watches`` reached, an error raised to the caller of
:class:`~qpolicy.runtime.inotify.Inotify`), the watch says why once and walks the hierarchy every
``WALK_EVERY_S`` as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from qpolicy.desired.annotations import Annotations, annotation_of, path_under, scan
from qpolicy.model import PodSpec
from qpolicy.runtime.inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_DONT_FOLLOW,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Event,
    Inotify,
)

log = logging.getLogger(__name__)

MASK = (
    IN_ATTRIB
    | IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
)
# The safety walk while watching, and the walk without inotify (the daemon's cadence before).
RESCAN_EVERY_S = 60.0
WALK_EVERY_S = 1.0


class AnnotationWatch:
    """The annotations under the cgroup v2 mount ``root``; :meth:`refresh` brings them up to
    date (cheap while nothing changed) and says whether they changed."""

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        inotify: Callable[[], Inotify] = Inotify,
    ) -> None:
        self.root = root
        self._top = str(root)
        self._clock = clock
        self._pods: dict[str, PodSpec] = {}
        self._errors: dict[str, str] = {}
        self._wds: dict[int, str] = {}  # watch descriptor -> cgroup path
        self._paths: dict[str, int] = {}  # cgroup path -> watch descriptor
        self.annotations = Annotations()
        # Why the hierarchy is walked every second rather than watched (None while watching).
        self.unwatched: str | None = None
        self._inotify: Inotify | None = None
        try:
            self._inotify = inotify()
        except OSError as error:
            self._give_up(f"no inotify instance ({error.strerror or error})")
        self._walked_at = self._clock()
        self._full_walk()
        self.annotations = self._built()

    @property
    def watches(self) -> int:
        return len(self._wds)

    def refresh(self) -> bool:
        """True where the annotations changed since the last call."""
        now = self._clock()
        if self._inotify is None:
            if now - self._walked_at < WALK_EVERY_S:
                return False
            self._walked_at = now
            return self._take(scan(self.root))
        try:
            events = self._inotify.read()
        except OSError as error:
            self._give_up(f"reading inotify events: {error.strerror or error}")
            return self._take(scan(self.root))
        walk = now - self._walked_at >= RESCAN_EVERY_S
        if not events and not walk:
            return False
        for event in events:
            if not self._apply(event):
                walk = True
                break
        if walk and self._inotify is not None:
            self._walked_at = now
            self._full_walk()
        if self._inotify is None:  # given up on the way
            return self._take(scan(self.root))
        return self._take(self._built())

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    # -- what changed ---------------------------------------------------------------------------

    def _apply(self, event: Event) -> bool:
        """Takes one event in; False where only a walk of the whole hierarchy can."""
        if event.mask & IN_Q_OVERFLOW:
            log.info("the cgroup watch's event queue overflowed: walking %s again", self._top)
            return False
        path = self._wds.get(event.wd)
        if path is None:
            return True  # a watch dropped since (its directory removed or walked again)
        if event.mask & IN_IGNORED:
            self._wds.pop(event.wd, None)
            if self._paths.get(path) == event.wd:
                self._forget(path)
            return True
        if not event.name:  # about the watched directory itself
            if event.mask & IN_DELETE_SELF:
                self._forget(path)
            elif event.mask & IN_ATTRIB:
                self._read(path)
            return True
        if not event.mask & IN_ISDIR:
            return True  # a file: cgroupfs's are control files, never annotated
        child = self._join(path, event.name)
        if event.mask & (IN_CREATE | IN_MOVED_TO):
            self._walk(child)
        elif event.mask & (IN_DELETE | IN_MOVED_FROM):
            self._forget(child)
        # IN_ATTRIB of a child comes on the child's own watch too, and is read there.
        return True

    def _walk(self, path: str) -> set[str]:
        """Watches and reads the subtree at ``path``; the paths it found."""
        found: set[str] = set()
        for directory, _subdirs, _files in os.walk(self._directory(path)):
            here = path_under(directory, self._top)
            if self._inotify is not None:
                try:
                    wd = self._inotify.add(directory, MASK)
                except FileNotFoundError:
                    continue  # removed while we walked
                except OSError as error:
                    self._give_up(f"watching {directory}: {error.strerror or error}")
                else:
                    stale = self._paths.get(here)
                    if stale is not None and stale != wd:
                        self._wds.pop(stale, None)
                    old = self._wds.get(wd)
                    if old is not None and old != here and self._paths.get(old) == wd:
                        # The same directory under a new name (renamed): its old name is gone.
                        self._forget(old)
                    self._wds[wd] = here
                    self._paths[here] = wd
            found.add(here)
            self._read(here)
        return found

    def _full_walk(self) -> None:
        found = self._walk("/")
        for path in [p for p in self._paths if p not in found]:
            wd = self._paths.get(path)  # None: forgotten with a directory above it
            if wd is None:
                continue
            self._forget(path)
            if self._inotify is not None:
                self._inotify.remove(wd)
        for path in [p for p in (*self._pods, *self._errors) if p not in found]:
            self._pods.pop(path, None)
            self._errors.pop(path, None)

    def _read(self, path: str) -> None:
        found = annotation_of(self._directory(path), path)
        self._pods.pop(path, None)
        self._errors.pop(path, None)
        if isinstance(found, PodSpec):
            self._pods[path] = found
        elif found is not None:
            self._errors[path] = found

    def _forget(self, path: str) -> None:
        """Drops ``path`` and everything below it."""
        below = path.rstrip("/") + "/"
        for known in [p for p in self._paths if p == path or p.startswith(below)]:
            self._wds.pop(self._paths.pop(known), None)
        for known in [p for p in (*self._pods, *self._errors) if p == path or p.startswith(below)]:
            self._pods.pop(known, None)
            self._errors.pop(known, None)

    # -- helpers --------------------------------------------------------------------------------

    def _give_up(self, why: str) -> None:
        log.warning(
            "annotations: %s; walking %s every %.0f s instead (raise fs.inotify.max_user_watches"
            " or max_user_instances to watch it)",
            why,
            self._top,
            WALK_EVERY_S,
        )
        self.unwatched = why
        self.close()
        self._wds.clear()
        self._paths.clear()

    def _take(self, annotations: Annotations) -> bool:
        if annotations == self.annotations:
            return False
        self.annotations = annotations
        return True

    def _built(self) -> Annotations:
        return Annotations(dict(sorted(self._pods.items())), dict(sorted(self._errors.items())))

    def _directory(self, path: str) -> str:
        return self._top if path == "/" else os.path.join(self._top, path.lstrip("/"))

    @staticmethod
    def _join(path: str, name: str) -> str:
        return "/" + name if path == "/" else f"{path}/{name}"
