"""A small process beside the daemon that undoes what the rm enforcer changed as soon as the
daemon dies without undoing it itself.

A daemon killed with SIGKILL (the OOM killer, a crash in a native library, a runtime's stop after
its grace period) sends nothing on its way out. Its record (:mod:`~.record`) lets the next daemon
re-open the pod it had closed, but only once that daemon holds the node's lock, and the dead one
lets go of it only at the end of its exit: the probe's uprobes are taken down as its files close
(1.3-2 s on an H200, BENCHMARKS.md 2026-12-01, call 22E). A pod closed at the kill stood 2.2-2.6 s
(call 25B). The guard sees the death as it begins: the kernel marks each exiting thread
``PF_EXITING`` (``exit_signals()``, first in ``do_exit()``, before its files are closed), shown in
``/proc/PID/task/TID/stat``. Once every thread of the daemon is exiting (a thread inside a driver
call finishes it first, so nothing the daemon sent can land after the guard's controls) the guard
runs the same recovery the next daemon would, on the records the daemon wrote, and exits.

It is a separate process (``python -m qpolicy.enforcers.rm.guard``), not a thread: a thread dies
with the daemon. It sets its ``oom_score_adj`` to -1000: on cgroup v2 the kubelet (1.28 on) sets
``memory.oom.group`` on each container, so the OOM killer takes every process of the agent's
container at once, all but those at -1000 (Documentation/admin-guide/cgroup-v2.rst,
``memory.oom.group``). The guard stays about 17 MB, whatever the node runs. It is the daemon's child
but in a session of its own (a terminal's Ctrl-C is the daemon's to handle), ignores SIGINT and
SIGTERM (a service manager that signals every process of the unit must not take it before the
daemon's own shutdown is done), and exits when its daemon has. It watches with a ``pidfd`` (woken
when the daemon is gone) and looks at the daemon's threads every :data:`WATCH_S`: one read of a
/proc file while the daemon lives, 10-20 us.

The next daemon's recovery and the guard's take the same lock (:func:`~.record.recover`), and the
guard undoes only records its own daemon wrote: one woken late never touches what a successor
closed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from qpolicy.enforcers.rm.record import Recovery, process_start_time, recover

log = logging.getLogger(__name__)

#: ``PF_EXITING`` (include/linux/sched.h): set by ``exit_signals()`` as ``do_exit()`` begins.
PF_EXITING = 0x00000004
#: How often the daemon's threads are looked at while it lives: a pod closed at a kill waits this
#: long at most, besides the recovery's own controls (~1 ms each under GSP).
WATCH_S = 0.05
#: How often a daemon checks that its guard is still there, and starts another if not.
CHECK_EVERY_S = 10.0
#: OOM_SCORE_ADJ_MIN: never chosen by the OOM killer, nor killed with its group.
OOM_SCORE_ADJ_MIN = -1000


def spare_from_oom(path: Path = Path("/proc/self/oom_score_adj")) -> bool:
    """Keep this process out of the OOM killer's reach (root only); whether it could."""
    try:
        path.write_text(f"{OOM_SCORE_ADJ_MIN}\n")
    except OSError as error:
        log.warning(
            "guard: cannot set oom_score_adj to %d (%s): an OOM kill of the daemon's container "
            "takes the guard too",
            OOM_SCORE_ADJ_MIN,
            error,
        )
        return False
    return True


def _stat(path: Path) -> tuple[str, int, int] | None:
    """State letter, flags and start time of the task whose ``stat`` file is ``path``."""
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[6]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _exiting(stat: tuple[str, int, int] | None) -> bool:
    return stat is None or stat[0] in ("Z", "X") or bool(stat[1] & PF_EXITING)


def daemon_dying(pid: int, start_time: int, proc: Path = Path("/proc")) -> bool:
    """Whether the daemon ``pid`` (started at ``start_time``) is gone, or every thread of it is
    exiting: none can send anything more to RM. The leader alone is read while it lives."""
    leader = _stat(proc / str(pid) / "stat")
    if leader is None or leader[2] != start_time:
        return True  # gone (its pid may be another process's by now)
    if not _exiting(leader):
        return False
    try:
        tids = [entry.name for entry in (proc / str(pid) / "task").iterdir()]
    except OSError:
        return True
    return all(_exiting(_stat(proc / str(pid) / "task" / tid / "stat")) for tid in tids)


def _pidfd(pid: int) -> int | None:
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return None


def watch(
    pid: int,
    start_time: int,
    *,
    dying: Callable[[int, int], bool] = daemon_dying,
    every_s: float = WATCH_S,
) -> None:
    """Return once the daemon is dying (:func:`daemon_dying`)."""
    pidfd = _pidfd(pid)
    poller = None
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
    try:
        while not dying(pid, start_time):
            if poller is not None:
                poller.poll(every_s * 1000)
            else:
                time.sleep(every_s)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def guard(
    pid: int,
    start_time: int,
    state_dir: Path,
    *,
    dying: Callable[[int, int], bool] = daemon_dying,
    every_s: float = WATCH_S,
) -> Recovery:
    """Watch the daemon until it dies, then undo what it left changed."""
    watch(pid, start_time, dying=dying, every_s=every_s)
    began = time.monotonic()
    recovery = recover(state_dir, writer=(pid, start_time))
    if recovery.opened or recovery.restored:
        log.warning(
            "guard: daemon %d died without undoing its changes: re-opened %d channel group(s) "
            "and restored %d timeslice(s) in %.1f ms",
            pid,
            recovery.opened,
            recovery.restored,
            (time.monotonic() - began) * 1000,
        )
    for problem in recovery.problems:
        log.warning("guard: could not undo what daemon %d changed: %s", pid, problem)
    return recovery


class Guard:
    """The daemon's side: its guard process, started again if it went away."""

    def __init__(
        self,
        state_dir: Path,
        *,
        spawn: Callable[[Sequence[str]], subprocess.Popen[bytes]] | None = None,
        pid: int | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.pid = os.getpid() if pid is None else pid
        start_time = process_start_time(self.pid)
        if start_time is None:
            raise OSError(f"cannot read the start time of pid {self.pid} from /proc")
        self.start_time = start_time
        self._spawn = spawn or _spawn
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.start()

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "qpolicy.enforcers.rm.guard",
            "--pid",
            str(self.pid),
            "--start-time",
            str(self.start_time),
            "--state-dir",
            str(self.state_dir),
        ]

    def start(self) -> None:
        self.process = self._spawn(self.argv())

    def check(self) -> None:
        """Start the guard again if it exited (killed, or it failed to start)."""
        if self.process is None or self.process.poll() is None:
            return
        log.warning(
            "the rm enforcer's guard (pid %d) exited with %s: starting another",
            self.process.pid,
            self.process.returncode,
        )
        try:
            self.start()
        except OSError as error:  # tried again at the next check
            log.warning("cannot start the rm enforcer's guard: %s", error)
            return
        self.restarts += 1

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def status(self) -> dict[str, object]:
        return {
            "pid": self.process.pid if self.process is not None else None,
            "running": self.running,
            "restarts": self.restarts,
        }

    def stop(self) -> None:
        """The daemon undid its changes itself: nothing is left to guard."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        self.process = None


def _spawn(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    # Its own session: a terminal's signals are the daemon's. stderr is the daemon's, so its
    # lines go where the daemon's do. The package is found where the daemon found it.
    package_root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env={**os.environ, "PYTHONPATH": path},
    )


def start_guard(state_dir: Path) -> Guard | None:
    """The daemon's guard, or None (with a warning) where it cannot be started."""
    try:
        return Guard(state_dir)
    except OSError as error:
        log.warning(
            "cannot start the rm enforcer's guard (%s): a pod closed when the daemon is killed "
            "stays closed until the next daemon starts",
            error,
        )
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the daemon's pid")
    parser.add_argument("--start-time", type=int, required=True, help="its start time, in ticks")
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spare_from_oom()
    guard(args.pid, args.start_time, args.state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
