"""The rm enforcer's guard against a real slow exit: a process holding uprobes takes seconds to
exit after SIGKILL (each uprobe is taken down as its files close; 1.3-2 s for the daemon's probe on
an H200, about 90 ms an uprobe on this machine's kernel), and the guard must act as the exit
begins, not when it ends. What shows it acted: the record it undoes is gone while the killed
process has not yet exited. Its looks at the daemon are a minute apart here, so only the alarm
(the pipe whose write end the daemon holds at its highest descriptor) can have woken it; its
pidfd wakes it only once the exit has ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.ebpf.conftest import ROOT

# A stand-in daemon: it starts its guard as the rm enforcer does, then loads a BPF program on
# uprobes of libc's functions (what makes its exit slow), and writes a record naming itself. The
# record's one closed group is of a process that has exited (RM is not asked: no GPU here), so
# the recovery only removes the record.
DAEMON = r"""
import json, os, sys, time
from pathlib import Path
from bcc import BPF
from qpolicy.enforcers.rm.guard import Guard
from qpolicy.enforcers.rm.record import RECORD_NAME, process_start_time

state = Path(sys.argv[1])
# Started before the probe loads, as RmBackendFactory.prepare starts it. Its looks a minute
# apart: what wakes it before the exit ends can only be the alarm.
guard = Guard(state, look_every_s=60)
bpf = BPF(text="int hit(void *ctx) { return 0; }")
libc = "c"  # bcc finds the library by its name, as ldconfig knows it
names = ["malloc", "free", "calloc", "realloc", "memcpy", "memset", "strlen", "strcmp", "open",
         "close", "read", "write", "fopen", "fclose", "printf", "puts", "getenv", "setenv",
         "qsort", "bsearch", "strtol", "strtoul", "atoi", "abs", "labs", "rand", "srand", "time",
         "clock", "sleep", "usleep", "nanosleep", "getpid", "getppid", "pipe", "dup", "dup2",
         "fcntl", "ioctl", "mmap", "munmap", "mprotect", "socket", "bind", "listen", "accept",
         "connect", "send", "recv", "select", "poll", "kill", "raise", "strdup", "strchr",
         "strrchr", "strstr", "strncmp", "strcpy", "strncpy", "memmove", "memcmp", "memchr"]
attached = 0
for name in names:
    try:
        bpf.attach_uprobe(name=libc, sym=name, fn_name="hit")
        attached += 1
    except Exception:
        pass
me = os.getpid()
record = {"version": 2, "writer": {"pid": me, "start_time": process_start_time(me)},
          "closed": {"k": {"pid": int(sys.argv[2]), "start_time": 1, "fd": 8, "client": 1,
                           "subdevice": 2, "channels": [1]}},
          "timeslices": {}}
(state / RECORD_NAME).write_text(json.dumps(record))
print(json.dumps({"uprobes": attached, "guard": guard.process.pid}), flush=True)
time.sleep(600)
"""


def test_the_guard_undoes_a_killed_daemons_record_while_its_slow_exit_is_under_way(
    tmp_path: Path,
) -> None:
    tenant = subprocess.Popen([sys.executable, "-c", "pass"])
    tenant.wait()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(tmp_path), str(tenant.pid)],
        stdout=subprocess.PIPE,
        env=env,
    )
    record = tmp_path / "rm-record.json"
    try:
        assert daemon.stdout is not None
        started = json.loads(daemon.stdout.readline())
        assert started["uprobes"] >= 40, started
        time.sleep(1.5)  # the guard is up and has looked at the daemon: the record stays
        assert record.exists()
        os.kill(daemon.pid, signal.SIGKILL)
        killed = time.monotonic()
        while record.exists() and time.monotonic() - killed < 60:
            time.sleep(0.001)
        undone = time.monotonic() - killed
        # Not exited yet (WNOWAIT: left for the wait below): the guard acted as the exit began.
        still_exiting = os.waitid(os.P_PID, daemon.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        assert not record.exists()
        assert still_exiting is None, (
            f"the daemon had exited when the record was undone ({undone:.3f} s)"
        )
        daemon.wait(timeout=120)
        exited = time.monotonic() - killed
        print(f"record undone {undone * 1000:.0f} ms after SIGKILL; exited after {exited:.1f} s")
        assert undone < exited
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
