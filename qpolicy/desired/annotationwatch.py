"""Cgroup annotations kept current by inotify instead of a walk of the hierarchy every second,
in bounded slices of the daemon's loop thread.

A walk lists every entry of every cgroup directory, and each has dozens of control files: on a
tree shaped like a Kubernetes node's with 100 pods (437 directories of 60 entries each, on
tmpfs) one walk took 18 ms, 1.8 % of a core at one walk a second (`make bench`'s annotations
row, BENCHMARKS.md 2026-12-07), against the daemon's 2 % target for all it does. The hierarchy is
walked once, watching each directory, and then only what inotify reports is read again:

* a directory created or moved in (``IN_CREATE``/``IN_MOVED_TO`` with ``IN_ISDIR``, from
  vfs_mkdir/vfs_rename's fsnotify calls, which cgroupfs's mkdir and rename go through): its
  subtree is watched and read, each directory watched before it is listed, so a child made
  meanwhile is either listed or reported;
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
:class:`~qpolicy.runtime.inotify.Inotify`), the watch says why and walks the hierarchy every
``WALK_EVERY_S`` as before, and watches again once the refused limit is raised.

The tree is not the daemon's to size: a tenant given a cgroup subtree (a pod running systemd,
rootless containers) can make thousands of cgroups, and the loop thread that reads them also
hands the GPUs over. On a 100-pod node with a tenant's 5 000 cgroups (5 494 directories, on
tmpfs) one walk held that thread 232-326 ms in one go, and without inotify that was every second,
20 % of a core (`make bench` annotations, BENCHMARKS.md 2026-12-07, fifty-eighth session); each
overflow of a flood of mkdirs asked for another walk. So, beyond the first walk (the daemon
starts knowing its pods):

* a refresh works at most ``SLICE_S``: events are read from the kernel's queue and directories
  visited until then, and the rest waits for the next refresh (events in the kernel's queue,
  which overflows into one walk instead of growing);
* whole walks (the safety walk, after an overflow, and every walk without inotify) are spaced
  so that they take at most ``WALK_SHARE`` of a core, however big the tree: a walk that cost
  250 ms starts 25 s after the one before started, not every second.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from qpolicy.desired.annotations import Annotations, annotation_of
from qpolicy.model import PodSpec
from qpolicy.runtime.dirtree import subdirectories
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
# The most one refresh works on the daemon's loop thread (its hand-overs wait meanwhile).
SLICE_S = 0.002
# The most of one core that whole walks take, on average.
WALK_SHARE = 0.01
INOTIFY_LIMITS = Path("/proc/sys/fs/inotify")


def inotify_limits(directory: Path = INOTIFY_LIMITS) -> tuple[int, int]:
    """``(max_user_instances, max_user_watches)``; 0 for one that cannot be read."""
    values = []
    for name in ("max_user_instances", "max_user_watches"):
        try:
            values.append(int((directory / name).read_text().strip()))
        except (OSError, ValueError):
            values.append(0)
    return values[0], values[1]


class AnnotationWatch:
    """The annotations under the cgroup v2 mount ``root``; :meth:`refresh` brings them up to
    date (cheap while nothing changed) and says whether they changed.

    ``clock`` schedules the walks; ``timer`` measures the work of a refresh (its slice) and
    what a walk cost.
    """

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
        inotify: Callable[[], Inotify] = Inotify,
        limits: Callable[[], tuple[int, int]] = inotify_limits,
    ) -> None:
        self.root = root
        self._top = str(root)
        self._clock = clock
        self._timer = timer
        self._make_inotify = inotify
        self._limits = limits
        self._pods: dict[str, PodSpec] = {}
        self._errors: dict[str, str] = {}
        self._wds: dict[int, str] = {}  # watch descriptor -> cgroup path
        self._paths: dict[str, int] = {}  # cgroup path -> watch descriptor
        self._children: dict[str, set[str]] = {}  # every directory visited -> its known children
        self._todo: list[str] = []  # directories to visit (cgroup paths), a stack
        self._pending: deque[Event] = deque()  # read from the kernel, not applied yet
        self._found: set[str] | None = None  # what the whole walk under way visited
        self._walk_wanted = False  # events were lost: a whole walk, as soon as its share allows
        self._walk_started = 0.0
        self._walk_spent = 0.0
        self._changed = False
        # The limits when inotify refused, to watch again once one is raised (None: watching).
        self._refused_at: tuple[int, int] | None = None
        self.annotations = Annotations()
        # Why the hierarchy is walked rather than watched (None while watching).
        self.unwatched: str | None = None
        # What the last whole walk cost (s of ``timer``); how often the event queue overflowed.
        self.walk_cost_s = 0.0
        self.overflows = 0
        self._inotify: Inotify | None = None
        try:
            self._inotify = inotify()
        except OSError as error:
            self._give_up(f"no inotify instance ({error.strerror or error})")
        self._start_walk(self._clock())
        # The first walk whole, so that the daemon starts knowing its pods; what changed meanwhile
        # is in the queue for the first refresh (read here, a flood would never let it end).
        self._work(float("inf"), None)
        self.annotations, self._changed = self._built(), False

    @property
    def watches(self) -> int:
        return len(self._wds)

    @property
    def directories(self) -> int:
        """The cgroup directories known (visited, and not removed since)."""
        return len(self._children)

    @property
    def walk_every_s(self) -> float:
        """How long from one whole walk's start to the next's, unless events were lost."""
        base = RESCAN_EVERY_S if self._inotify is not None else WALK_EVERY_S
        return max(base, self.walk_cost_s / WALK_SHARE)

    def refresh(self) -> bool:
        """True where the annotations changed since the last call."""
        self._work(self._timer() + SLICE_S, self._clock())
        if not self._changed:
            return False
        return self._take(self._built())

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    # -- the work of a refresh ------------------------------------------------------------------

    def _work(self, deadline: float, now: float | None) -> None:
        """Events, for at most half the time to ``deadline`` (of ``timer``), so that a flood of
        them does not starve the directories they ask to visit; then a whole walk if one is due
        at ``now``; then directories to visit, until done or ``deadline``. ``now`` None: the
        first walk, no events."""
        started = self._timer()
        if now is not None:
            self._take_events(started + (deadline - started) / 2)
            if self._found is None and now >= self._next_walk_at():
                self._start_walk(now)
        while self._todo and self._timer() < deadline:
            self._visit(self._todo.pop())
        if self._found is not None:
            self._walk_spent += self._timer() - started
            if not self._todo:
                self._end_walk()

    def _take_events(self, until: float) -> None:
        """Events read and applied until there are none or ``until`` (of ``timer``); the rest
        stay in the kernel's queue, or in ``_pending`` if already read."""
        while self._inotify is not None:
            if not self._pending:
                if self._timer() >= until:
                    return
                try:
                    self._pending.extend(self._inotify.read_some())
                except OSError as error:
                    self._give_up(f"reading inotify events: {error.strerror or error}")
                    self._walk_wanted = True
                    return
                if not self._pending:
                    return
            if not self._apply(self._pending.popleft()):
                self._overflowed()
            if self._timer() >= until:
                return

    def _overflowed(self) -> None:
        """The kernel dropped events: a whole walk, once its share of a core allows. Said once
        until then (a flood overflows the queue again at every refresh that falls behind)."""
        self.overflows += 1
        if not self._walk_wanted:
            self._walk_wanted = True
            log.info(
                "the cgroup watch's event queue overflowed: walking %s again in %.1f s",
                self._top,
                max(0.0, self._next_walk_at() - self._clock()),
            )

    def _next_walk_at(self) -> float:
        if self._walk_wanted:
            return self._walk_started + self.walk_cost_s / WALK_SHARE
        return self._walk_started + self.walk_every_s

    def _start_walk(self, now: float) -> None:
        if self._inotify is None and self._refused_at is not None:
            self._watch_again()
        self._walk_wanted = False
        self._walk_started, self._walk_spent = now, 0.0
        self._found = set()
        self._todo.append("/")

    def _end_walk(self) -> None:
        """Forgets what the walk did not find: removed while no watch could report it."""
        found, self._found = self._found or set(), None
        known = (*self._children, *self._paths, *self._pods, *self._errors)
        for path in {p for p in known if p not in found}:
            wd = self._paths.get(path)  # None: forgotten with a directory above it
            self._forget(path)
            if wd is not None and self._inotify is not None:
                self._inotify.remove(wd)
        self.walk_cost_s = self._walk_spent

    def _visit(self, path: str) -> None:
        """Watches ``path``, then lists it (its subdirectories to visit) and reads it."""
        directory = self._directory(path)
        if self._inotify is not None:
            try:
                wd = self._inotify.add(directory, MASK)
            except FileNotFoundError:
                return  # removed since it was listed
            except OSError as error:
                self._give_up(f"watching {directory}: {error.strerror or error}")
            else:
                self._watched(path, wd)
        subdirs = subdirectories(directory)
        if subdirs is None:
            return  # removed since it was listed (its watch, if any, goes with IN_IGNORED)
        self._children.setdefault(path, set())
        if path != "/":
            self._children.setdefault(self._parent(path), set()).add(path)
        if self._found is not None:
            self._found.add(path)
        self._read(path)
        self._todo.extend(self._join(path, name) for name in subdirs)

    def _watched(self, path: str, wd: int) -> None:
        stale = self._paths.get(path)
        if stale is not None and stale != wd:
            self._wds.pop(stale, None)
        old = self._wds.get(wd)
        if old is not None and old != path and self._paths.get(old) == wd:
            # The same directory under a new name (renamed): its old name is gone.
            self._forget(old)
        self._wds[wd] = path
        self._paths[path] = wd

    # -- what changed ---------------------------------------------------------------------------

    def _apply(self, event: Event) -> bool:
        """Takes one event in; False where only a walk of the whole hierarchy can."""
        if event.mask & IN_Q_OVERFLOW:
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
            self._todo.append(child)
        elif event.mask & (IN_DELETE | IN_MOVED_FROM):
            self._forget(child)
        # IN_ATTRIB of a child comes on the child's own watch too, and is read there.
        return True

    def _read(self, path: str) -> None:
        found = annotation_of(self._directory(path), path)
        pod, error = self._pods.pop(path, None), self._errors.pop(path, None)
        if isinstance(found, PodSpec):
            self._pods[path] = found
            self._changed = self._changed or pod != found
        elif found is not None:
            self._errors[path] = found
            self._changed = self._changed or error != found
        else:
            self._changed = self._changed or pod is not None or error is not None

    def _forget(self, path: str) -> None:
        """Drops ``path`` and everything below it: as many steps as the subtree has
        directories, not as many as the tree has."""
        below = [path]
        for known in below:
            below += self._children.pop(known, ())
            wd = self._paths.pop(known, None)
            if wd is not None:
                self._wds.pop(wd, None)
            pod, error = self._pods.pop(known, None), self._errors.pop(known, None)
            self._changed = self._changed or pod is not None or error is not None
        if path != "/":
            self._children.get(self._parent(path), set()).discard(path)

    # -- inotify refused ------------------------------------------------------------------------

    def _give_up(self, why: str) -> None:
        log.warning(
            "annotations: %s; walking %s instead, every %.0f s or as often as %.0f %% of a core"
            " allows (raise fs.inotify.max_user_watches or max_user_instances to watch it again)",
            why,
            self._top,
            WALK_EVERY_S,
            WALK_SHARE * 100,
        )
        self.unwatched = why
        self._refused_at = self._limits()
        self.close()
        self._pending.clear()
        self._wds.clear()
        self._paths.clear()

    def _watch_again(self) -> None:
        """A new inotify instance where a limit that refused one was raised since."""
        limits = self._limits()
        refused = self._refused_at or limits
        if not any(now > then for now, then in zip(limits, refused, strict=True)):
            return
        try:
            self._inotify = self._make_inotify()
        except OSError as error:
            self._give_up(f"no inotify instance ({error.strerror or error})")
            return
        log.info("annotations: inotify limits raised to %s; watching %s again", limits, self._top)
        self.unwatched, self._refused_at = None, None

    # -- helpers --------------------------------------------------------------------------------

    def _take(self, annotations: Annotations) -> bool:
        self._changed = False
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

    @staticmethod
    def _parent(path: str) -> str:
        return path.rsplit("/", 1)[0] or "/"
