"""A small process beside the daemon that undoes what the rm enforcer changed as soon as the
daemon dies without undoing it itself.

A daemon killed with SIGKILL (the OOM killer, a crash in a native library, a runtime's stop after
its grace period) sends nothing on its way out. Its record (:mod:`~.record`) lets the next daemon
re-open the pod it had closed, but only once that daemon holds the node's lock, and the dead one
lets go of it only at the end of its exit: the probe's uprobes are taken down as its files close
(1.3-2 s on an H200, BENCHMARKS.md 2026-12-01, call 22E). A pod closed at the kill stood 2.2-2.6 s
(call 25B).

The guard learns of the death as the exit begins, from a pipe (the *alarm*) whose only write end
the daemon holds at a high descriptor number: the last thread's ``exit_files()`` closes the
descriptors in ascending order, each ``fput()`` is deferred to ``task_work`` and those run newest
first, so the highest descriptor is released before the probe's. On this machine's 6.18 kernel, a
process holding 94 uprobes took 8.8 s to exit after SIGKILL; a pipe at descriptor 1000 read EOF
after 9 ms, one at 5 with the pidfd after 8.8 s. The files are closed once every thread has
exited its system call, so nothing the daemon sent lands after the guard's controls; the guard
checks it anyway (``PF_EXITING``, set by ``exit_signals()`` as ``do_exit()`` begins, in each
``/proc/PID/task/TID/stat``). Then it runs the same recovery the next daemon would, on the records
the daemon wrote, and exits. Should a kernel release them in another order, it also looks at the
daemon every :data:`FALLBACK_S` and wakes with its ``pidfd``: it waits no longer than that.

It is a separate process (``python -m qpolicy.enforcers.rm.guard``), not a thread: a thread dies
with the daemon. It sets its ``oom_score_adj`` to -1000: on cgroup v2 the kubelet (1.28 on) sets
``memory.oom.group`` on each container, so the OOM killer takes every process of the agent's
container at once, all but those at -1000 (Documentation/admin-guide/cgroup-v2.rst,
``memory.oom.group``). The guard stays about 17 MB, whatever the node runs, and sleeps in ``poll()``
but for a look a second (0.01 % of a core). It is the daemon's child but in a session of its own (a
terminal's Ctrl-C is the daemon's to handle), ignores SIGINT and SIGTERM (a service manager that
signals every process of the unit must not take it before the daemon's own shutdown is done), and
exits when its daemon has.

The next daemon's recovery and the guard's take the same lock (:func:`~.record.recover`), and the
guard undoes only records its own daemon wrote: one woken late never touches what a successor
closed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import resource
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from qpolicy.enforcers.rm.record import Recovery, parse_stat, process_start_time, recover

log = logging.getLogger(__name__)

#: ``PF_EXITING`` (include/linux/sched.h): set by ``exit_signals()`` as ``do_exit()`` begins.
PF_EXITING = 0x00000004
#: How often the daemon is looked at while it lives, where the alarm did not ring (a kernel that
#: releases files in another order): a pod closed at a kill waits this long at most.
FALLBACK_S = 1.0
#: How often, once the alarm rang, the daemon's threads are looked at until all are exiting.
WATCH_S = 0.005
#: The highest descriptor the alarm's write end is put at (the limit on open files permitting):
#: the fd table grows to it, 8 bytes a slot.
ALARM_FD_MOST = 65535
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


# What a task's stat file says: its state letter, flags and start time; GONE where it has no
# such file any more (exited, reaped); None where it cannot be read or parsed (not known).
Stat = tuple[str, int, int]
GONE = ("X", 0, -1)


def _stat(path: Path) -> Stat | None:
    """What the task whose ``stat`` file is ``path`` is (see :data:`GONE`)."""
    try:
        return parse_stat(path.read_bytes())
    except (FileNotFoundError, ProcessLookupError):
        return GONE
    except OSError:
        return None


def _exiting(stat: Stat | None) -> bool:
    """Whether a thread can send nothing more: gone, a zombie, or exiting. Not known: no."""
    return stat is not None and (stat[0] in ("Z", "X") or bool(stat[1] & PF_EXITING))


class Leader:
    """The daemon's ``/proc/PID/stat``, kept open and read again from its start at each look:
    4 us a look where opening it each time took 33 (this machine). Read by its path where it
    could not be opened."""

    def __init__(self, pid: int, proc: Path = Path("/proc")) -> None:
        self.path = proc / str(pid) / "stat"
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def stat(self) -> Stat | None:
        if self.fd is None:
            return _stat(self.path)
        try:
            return parse_stat(os.pread(self.fd, 4096, 0))
        except ProcessLookupError:  # ESRCH: reaped, even if its pid is another's by now
            return GONE
        except OSError:
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def daemon_dying(
    pid: int, start_time: int, proc: Path = Path("/proc"), leader: Leader | None = None
) -> bool:
    """Whether the daemon ``pid`` (started at ``start_time``) is gone, or every thread of it is
    exiting: none can send anything more to RM. The leader alone is read while it lives (through
    ``leader``, opened once, where given). What cannot be read is not taken for a death: undoing
    what a live daemon closed would break its turns, and lose its record."""
    stat = leader.stat() if leader is not None else _stat(proc / str(pid) / "stat")
    if stat is None:
        return False
    if stat is GONE or stat[2] != start_time:
        return True  # gone (its pid may be another process's by now)
    if not _exiting(stat):
        return False
    try:
        tids = [entry.name for entry in (proc / str(pid) / "task").iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False
    return all(_exiting(_stat(proc / str(pid) / "task" / tid / "stat")) for tid in tids)


def _pidfd(pid: int) -> int | None:
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return None


def watch(
    pid: int,
    start_time: int,
    *,
    alarm: int | None = None,
    dying: Callable[[int, int], bool] | None = None,
    every_s: float = FALLBACK_S,
) -> None:
    """Return once the daemon is dying (:func:`daemon_dying`): looked at when ``alarm`` (the read
    end of the daemon's alarm pipe) reads EOF, when its pidfd says it is gone, and every
    ``every_s``."""
    leader = Leader(pid)
    if dying is None:
        dying = lambda p, s: daemon_dying(p, s, leader=leader)  # noqa: E731
    pidfd = _pidfd(pid)
    poller = select.poll()
    for fd in (alarm, pidfd):
        if fd is not None:
            poller.register(fd, select.POLLIN)
    wait_s = every_s
    try:
        while not dying(pid, start_time):
            for fd, _ in poller.poll(wait_s * 1000):
                if fd == alarm:
                    # Rung: the daemon's files are going. Its threads are all exiting by now;
                    # looked at closely until they are (a pipe at EOF stays readable).
                    poller.unregister(fd)
                    wait_s = WATCH_S
    finally:
        leader.close()
        if pidfd is not None:
            os.close(pidfd)


def guard(
    pid: int,
    start_time: int,
    state_dir: Path,
    *,
    alarm: int | None = None,
    dying: Callable[[int, int], bool] | None = None,
    every_s: float = FALLBACK_S,
) -> Recovery:
    """Watch the daemon until it dies, then undo what it left changed."""
    watch(pid, start_time, alarm=alarm, dying=dying, every_s=every_s)
    began = time.monotonic()
    recovery = recover(state_dir, writer=(pid, start_time))
    if recovery.opened or recovery.restored or recovery.modes:
        log.warning(
            "guard: daemon %d died without undoing its changes: re-opened %d channel group(s), "
            "restored %d timeslice(s) and %d preemption mode(s) in %.1f ms",
            pid,
            recovery.opened,
            recovery.restored,
            recovery.modes,
            (time.monotonic() - began) * 1000,
        )
    for problem in recovery.problems:
        log.warning("guard: could not undo what daemon %d changed: %s", pid, problem)
    return recovery


class Alarm:
    """The daemon's end of the alarm: a pipe whose write end it alone holds, at a descriptor
    above any other it will open, so that its exit releases it first (see the module's
    docstring). The read end is passed to each guard it starts."""

    def __init__(self) -> None:
        read, write = os.pipe2(os.O_CLOEXEC)
        self.read = read
        self.write = write
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        highest = ALARM_FD_MOST if soft == resource.RLIM_INFINITY else min(soft - 1, ALARM_FD_MOST)
        with contextlib.suppress(OSError):  # else it stays low: the guard's looks still find it
            self.write = fcntl.fcntl(write, fcntl.F_DUPFD_CLOEXEC, highest)
            os.close(write)

    def close(self) -> None:
        for fd in (self.read, self.write):
            with contextlib.suppress(OSError):
                os.close(fd)


Spawn = Callable[[Sequence[str], Sequence[int]], "subprocess.Popen[bytes]"]


class Guard:
    """The daemon's side: its guard process, started again if it went away."""

    def __init__(
        self,
        state_dir: Path,
        *,
        spawn: Spawn | None = None,
        pid: int | None = None,
        look_every_s: float = FALLBACK_S,
    ) -> None:
        self.state_dir = state_dir
        self.look_every_s = look_every_s
        self.pid = os.getpid() if pid is None else pid
        start_time = process_start_time(self.pid)
        if start_time is None:
            raise OSError(f"cannot read the start time of pid {self.pid} from /proc")
        self.start_time = start_time
        self._spawn = spawn or _spawn
        self.alarm = Alarm()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        try:
            self.start()
        except OSError:
            self.alarm.close()
            raise

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
            "--alarm-fd",
            str(self.alarm.read),
            "--look-every",
            f"{self.look_every_s:g}",
        ]

    def start(self) -> None:
        self.process = self._spawn(self.argv(), (self.alarm.read,))

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
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=5)
            self.process = None
        self.alarm.close()


def _spawn(argv: Sequence[str], pass_fds: Sequence[int]) -> subprocess.Popen[bytes]:
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
        pass_fds=tuple(pass_fds),
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
    parser.add_argument("--alarm-fd", type=int, help="the read end of the daemon's alarm pipe")
    parser.add_argument(
        "--look-every", type=float, default=FALLBACK_S, help="seconds between looks at the daemon"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spare_from_oom()
    guard(args.pid, args.start_time, args.state_dir, alarm=args.alarm_fd, every_s=args.look_every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
