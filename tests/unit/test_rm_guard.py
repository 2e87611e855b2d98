"""The rm enforcer's guard: what a daemon killed with SIGKILL closed is opened as its exit begins,
by the process it started beside it, and nothing a live daemon or a successor changed is
touched."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qpolicy.backends.base import BackendContext
from qpolicy.backends.rm import RmBackend
from qpolicy.enforcers.rm import guard as guard_module
from qpolicy.enforcers.rm.guard import (
    GONE,
    PF_EXITING,
    Guard,
    Leader,
    daemon_dying,
    guard,
    spare_from_oom,
    watch,
)
from qpolicy.enforcers.rm.record import (
    LOCK_NAME,
    RECORD_NAME,
    RmRecord,
    parse_stat,
    process_start_time,
    recover,
)
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.abi import NvStatus
from qpolicy.nvrm.tracker import ClientChannels
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.telemetry.probesource import ProbeSource
from tests.unit.test_telemetry_live import FakeProbe


def stat_line(pid: int, state: str = "S", flags: int = 0x400040, start: int = 500) -> str:
    # /proc/PID/stat: pid (comm) state ppid pgrp session tty tpgid flags ... starttime (field 22)
    fields = [state, "1", str(pid), str(pid), "0", "-1", str(flags)] + ["0"] * 12 + [str(start)]
    return f"{pid} (python3 (qpolicy)) " + " ".join(fields + ["0"] * 30) + "\n"


def fake_proc(
    tmp_path: Path, pid: int, threads: dict[int, tuple[str, int]], start: int = 500
) -> Path:
    """A /proc with ``pid`` whose threads (tid -> state, flags) are given; the leader is ``pid``."""
    proc = tmp_path / "proc"
    leader = threads[pid]
    (proc / str(pid) / "task").mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(stat_line(pid, leader[0], leader[1], start))
    for tid, (state, flags) in threads.items():
        (proc / str(pid) / "task" / str(tid)).mkdir(exist_ok=True)
        (proc / str(pid) / "task" / str(tid) / "stat").write_text(
            stat_line(tid, state, flags, start)
        )
    return proc


RUNNING = ("S", 0x400040)
EXITING = ("S", 0x400040 | PF_EXITING)


@pytest.mark.parametrize(
    ("threads", "start", "dying"),
    [
        ({10: RUNNING, 11: RUNNING}, 500, False),
        # SIGKILL lands on each thread: one still inside a driver call has not begun its exit.
        ({10: EXITING, 11: RUNNING}, 500, False),
        ({10: ("Z", 0x400040 | PF_EXITING), 11: ("D", 0x400040)}, 500, False),
        ({10: EXITING, 11: EXITING}, 500, True),
        ({10: ("Z", 0x400040 | PF_EXITING), 11: ("X", 0)}, 500, True),
        ({10: ("Z", 0x400040 | PF_EXITING)}, 500, True),
        # The pid is another process's now: the daemon is gone.
        ({10: RUNNING}, 501, True),
    ],
)
def test_a_daemon_is_dying_once_every_thread_of_it_is_exiting(
    tmp_path: Path, threads: dict[int, tuple[str, int]], start: int, dying: bool
) -> None:
    proc = fake_proc(tmp_path, 10, threads, start)
    assert daemon_dying(10, 500, proc) is dying
    # The same through the leader's stat kept open, as the guard reads it.
    leader = Leader(10, proc)
    assert daemon_dying(10, 500, proc, leader=leader) is dying
    leader.close()


def test_a_stat_line_is_read_after_the_processs_own_name() -> None:
    """A process names itself: its comm may hold a ')' or bytes that are not UTF-8."""
    line = b"12 (a) b\xff) " + stat_line(12, "R", 0x404044, 777).split(") ", 1)[1].encode()
    assert parse_stat(line) == ("R", 0x404044, 777)
    assert parse_stat(b"12 (no closing paren") is None
    assert parse_stat(b"12 (x) S 1") is None  # cut short


def test_a_daemon_whose_proc_entry_is_gone_is_dead(tmp_path: Path) -> None:
    assert daemon_dying(10, 500, tmp_path)
    assert daemon_dying(10, 500, tmp_path, leader=Leader(10, tmp_path))


def test_what_cannot_be_read_is_not_taken_for_a_death(tmp_path: Path) -> None:
    """Undoing what a live daemon closed would break its turns and lose its record: a stat file
    that cannot be read (here a directory in its place), or reads as garbage, says nothing."""
    proc = fake_proc(tmp_path, 10, {10: EXITING, 11: RUNNING})
    (proc / "10" / "task" / "11" / "stat").unlink()
    (proc / "10" / "task" / "11" / "stat").mkdir()
    assert not daemon_dying(10, 500, proc)  # thread 11 cannot be read: it may be in a call
    (proc / "10" / "stat").write_text("garbage")
    assert not daemon_dying(10, 500, proc)
    assert not daemon_dying(10, 500, proc, leader=Leader(10, proc))
    (proc / "10" / "stat").unlink()
    (proc / "10" / "stat").mkdir()
    assert not daemon_dying(10, 500, proc)


def test_the_kernel_marks_a_live_process_running_and_a_zombie_dying() -> None:
    """The real /proc: this process is not dying; a child that exited and is not reaped is."""
    me = os.getpid()
    start = process_start_time(me)
    assert start is not None and not daemon_dying(me, start)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_start = process_start_time(child.pid)
    while (Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z":
        time.sleep(0.01)
    assert child_start is not None and daemon_dying(child.pid, child_start)
    leader = Leader(child.pid)
    assert leader.stat() is not None and daemon_dying(child.pid, child_start, leader=leader)
    child.wait()
    # Reaped: its stat, kept open, reads nothing (ESRCH), even once the pid is another's.
    assert leader.stat() is GONE and daemon_dying(child.pid, child_start, leader=leader)
    leader.close()


def test_the_alarm_wakes_the_guard_without_waiting_for_its_next_look() -> None:
    """The daemon's alarm pipe reads EOF as its files go: the guard looks at once, and closely
    until the daemon's threads are all exiting, not a FALLBACK_S later."""
    read, write = os.pipe()
    closed = threading.Event()
    looks: list[float] = []

    def dying(pid: int, start: int) -> bool:
        looks.append(time.monotonic())
        return closed.is_set() and len(looks) >= 4  # exiting a few looks after the alarm

    done = threading.Event()
    me = os.getpid()
    start = process_start_time(me)
    assert start is not None
    thread = threading.Thread(
        target=lambda: (watch(me, start, alarm=read, dying=dying, every_s=600), done.set())
    )
    thread.start()
    time.sleep(0.2)
    assert not done.is_set() and len(looks) == 1  # asleep: no look until something happens
    rang = time.monotonic()
    closed.set()
    os.close(write)
    assert done.wait(30)
    thread.join()
    os.close(read)
    assert len(looks) >= 4 and looks[-1] - rang < 30


def write_record(
    state_dir: Path, writer: dict[str, Any] | None, pid: int, start: int | None = None
) -> dict[str, Any]:
    """A record of one closed group of the tenant ``pid`` (started at ``start``, by default the
    process's own start time)."""
    start = process_start_time(pid) if start is None else start
    entry = {"pid": pid, "start_time": start, "fd": 8, "client": 0xC1D00042, "subdevice": 7,
             "channels": [1, 2]}  # fmt: skip
    document: dict[str, Any] = {"version": 2, "closed": {"k": entry}, "timeslices": {}}
    if writer is not None:
        document["writer"] = writer
    (state_dir / RECORD_NAME).write_text(json.dumps(document))
    return document


@pytest.fixture
def controls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int], bool]]:
    sent: list[tuple[int, list[int], bool]] = []

    def disable_channels(
        fd: int, client: int, subdevice: int, channels: list[int], *, disable: bool
    ) -> rmctl.ControlResult:
        sent.append((client, channels, disable))
        return rmctl.ControlResult(NvStatus.NV_OK, 1)

    monkeypatch.setattr(rmctl, "disable_channels", disable_channels)
    monkeypatch.setattr(rmctl, "borrow_fd", lambda pid, fd: os.open("/dev/null", os.O_RDONLY))
    return sent


def test_the_guard_opens_what_its_daemon_closed_once_it_is_dying_and_not_before(
    tmp_path: Path, controls: list[tuple[int, list[int], bool]]
) -> None:
    me = os.getpid()
    write_record(tmp_path, {"pid": 4242, "start_time": 9}, me)  # the tenant: this process
    looks: list[bool] = []

    def dying(pid: int, start: int) -> bool:
        assert (pid, start) == (4242, 9)
        # Still alive at the first two looks: nothing may be sent then.
        assert controls == [] and (tmp_path / RECORD_NAME).exists()
        looks.append(True)
        return len(looks) == 3

    recovery = guard(4242, 9, tmp_path, dying=dying, every_s=0.001)
    assert len(looks) == 3
    assert (recovery.opened, recovery.problems) == (1, ())
    assert controls == [(0xC1D00042, [1, 2], False)]
    assert not (tmp_path / RECORD_NAME).exists()


@pytest.mark.parametrize(
    "writer", [{"pid": 4343, "start_time": 9}, {"pid": 4242, "start_time": 8}, None, "4242"]
)
def test_the_guard_leaves_a_record_its_daemon_did_not_write(
    tmp_path: Path, controls: list[tuple[int, list[int], bool]], writer: Any
) -> None:
    """A guard woken late finds its successor's record (or one of a daemon before guards):
    opening what a live daemon closed would break its turns, and removing the record would leave
    that daemon's pods closed at its own kill."""
    document = write_record(tmp_path, writer, os.getpid())
    recovery = guard(4242, 9, tmp_path, dying=lambda pid, start: True)
    assert (recovery.opened, recovery.restored, recovery.problems) == (0, 0, ())
    assert controls == []
    assert json.loads((tmp_path / RECORD_NAME).read_text()) == document
    # The next daemon undoes any record.
    assert recover(tmp_path).opened == 1 and controls == [(0xC1D00042, [1, 2], False)]


def test_a_record_names_the_daemon_that_wrote_it(tmp_path: Path) -> None:
    record = RmRecord(tmp_path / RECORD_NAME)
    record.closing(ClientChannels(os.getpid(), None, 8, 0xC1D00042, 7, (1, 2), ()))
    writer = json.loads((tmp_path / RECORD_NAME).read_text())["writer"]
    assert writer == {"pid": os.getpid(), "start_time": process_start_time(os.getpid())}


def test_a_guard_and_the_next_daemon_never_undo_at_once(
    tmp_path: Path, controls: list[tuple[int, list[int], bool]]
) -> None:
    write_record(tmp_path, {"pid": 4242, "start_time": 9}, os.getpid())
    done = threading.Event()
    with open(tmp_path / LOCK_NAME, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the guard, recovering
        thread = threading.Thread(target=lambda: (recover(tmp_path), done.set()))
        thread.start()
        assert not done.wait(0.3)
        assert controls == []
    assert done.wait(10)
    thread.join()
    assert controls == [(0xC1D00042, [1, 2], False)]


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.killed = False

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


def test_a_guard_that_went_away_is_started_again(tmp_path: Path) -> None:
    spawned: list[list[str]] = []

    def spawn(argv: Any, pass_fds: Any) -> Any:
        spawned.append(list(argv))
        assert list(pass_fds) == [g_alarm_read()]  # the alarm's read end, and nothing else
        return FakeProcess(1000 + len(spawned))

    def g_alarm_read() -> int:
        argv = spawned[-1]
        return int(argv[argv.index("--alarm-fd") + 1])

    g = Guard(tmp_path, spawn=spawn)
    assert spawned == [g.argv()]
    assert g.argv()[1:3] == ["-m", "qpolicy.enforcers.rm.guard"]
    me = os.getpid()
    assert g.argv()[3:] == [
        "--pid", str(me), "--start-time", str(process_start_time(me)), "--state-dir", str(tmp_path),
        "--alarm-fd", str(g.alarm.read), "--look-every", "1",
    ]  # fmt: skip
    # The alarm's write end sits above every descriptor the daemon opens after it.
    later = os.open("/dev/null", os.O_RDONLY)
    assert g.alarm.write > later > g.alarm.read
    os.close(later)
    g.check()
    assert len(spawned) == 1 and g.status() == {"pid": 1001, "running": True, "restarts": 0}
    assert g.process is not None
    g.process.returncode = -9
    g.check()
    assert len(spawned) == 2 and g.status() == {"pid": 1002, "running": True, "restarts": 1}

    # A start that fails (no memory for a process) leaves the daemon running; tried again later.
    def fail(argv: Any, pass_fds: Any) -> Any:
        raise OSError(12, "Cannot allocate memory")

    g._spawn = fail
    g.process.returncode = -9
    g.check()
    assert g.status() == {"pid": 1002, "running": False, "restarts": 1}
    g._spawn = spawn
    g.check()
    assert len(spawned) == 3 and g.status() == {"pid": 1003, "running": True, "restarts": 2}


def rm_backend(tmp_path: Path, g: Guard | None) -> RmBackend:
    context = BackendContext(RealtimeLoop(), ProbeSource(FakeProbe()), tmp_path, lambda: None,
                             lambda: 0.0)  # fmt: skip
    return RmBackend(context, gpus=list, guard=g)  # type: ignore[arg-type]


def test_the_backend_stops_its_guard_at_a_clean_close_and_keeps_it_while_a_record_is_left(
    tmp_path: Path,
) -> None:
    processes: list[FakeProcess] = []

    def spawn(argv: Any, pass_fds: Any) -> Any:
        processes.append(FakeProcess(2000 + len(processes)))
        return processes[-1]

    backend = rm_backend(tmp_path, Guard(tmp_path, spawn=spawn))
    assert backend.status()["guard"] == {"pid": 2000, "running": True, "restarts": 0}
    backend.close()
    assert processes[0].killed

    # A control still queued at shutdown keeps the record: the guard undoes it after the exit.
    backend = rm_backend(tmp_path, Guard(tmp_path, spawn=spawn))
    backend.shared.record.closing(ClientChannels(os.getpid(), None, 8, 0xC1D00042, 7, (1,), ()))
    backend.close()
    assert not processes[1].killed


def may_leave_the_oom_killers_reach() -> bool:
    probe = "from pathlib import Path; Path('/proc/self/oom_score_adj').write_text('-1000')"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


DAEMON = """
import threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("up", flush=True)
time.sleep(60)
"""


def test_the_guard_process_opens_what_a_daemon_killed_with_sigkill_left_closed(
    tmp_path: Path,
) -> None:
    """End to end with real processes: a stand-in daemon (two threads) and its guard, started as
    the daemon starts it. The record names a tenant that has exited (RM is not asked: there is
    none here), so what shows the recovery ran is the record removed and the guard's exit."""
    tenant = subprocess.Popen([sys.executable, "-c", "pass"])
    tenant.wait()
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], stdout=subprocess.PIPE)
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == b"up\n"
        start = process_start_time(daemon.pid)
        assert start is not None
        write_record(tmp_path, {"pid": daemon.pid, "start_time": start}, tenant.pid, start=1)
        g = Guard(tmp_path, pid=daemon.pid)
        try:
            # Watching: many looks at the live daemon, the record left alone.
            time.sleep(1.5 * guard_module.FALLBACK_S)
            assert g.running and (tmp_path / RECORD_NAME).exists()
            assert g.process is not None
            # Out of the OOM killer's reach where a process here may be (CAP_SYS_RESOURCE, as
            # the daemon runs; this machine may lack it).
            adj = Path(f"/proc/{g.process.pid}/oom_score_adj").read_text()
            assert adj == ("-1000\n" if may_leave_the_oom_killers_reach() else "0\n")
            os.kill(daemon.pid, signal.SIGKILL)
            assert g.process is not None
            assert g.process.wait(timeout=30) == 0
            assert not (tmp_path / RECORD_NAME).exists()
        finally:
            g.stop()
    finally:
        daemon.kill()
        daemon.wait()


def test_the_guard_keeps_out_of_the_oom_killers_reach_or_says_it_cannot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adj = tmp_path / "oom_score_adj"
    adj.write_text("0\n")
    assert spare_from_oom(adj) and adj.read_text() == "-1000\n"
    assert not spare_from_oom(tmp_path / "missing" / "oom_score_adj")
    assert "OOM kill of the daemon's container takes the guard too" in caplog.text
