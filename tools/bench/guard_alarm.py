"""What the rm enforcer's guard (qpolicy/enforcers/rm/guard.py) costs, and why it wakes on a pipe.

As root, with bcc (tools/setup-ebpf.sh):

    .venv/bin/python tools/bench/guard_alarm.py [--uprobes 94] [--seconds 20]

1. A process holding ``--uprobes`` uprobes on libc (what makes the daemon's exit slow: its probe's
   uprobes are taken down as its files close) and two pipes, one write end at descriptor 1000 and
   one low, is killed with SIGKILL. Printed: when each pipe reads EOF, when its pidfd is readable,
   when it is reaped (ms after the kill).
2. A guard (as the daemon starts it) beside a sleeping stand-in daemon, and the same guard with
   no alarm looking every 50 ms (the first version's rate; it read /proc by path, this one
   through a descriptor kept open): their CPU over ``--seconds``, from /proc/PID/schedstat.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

VICTIM = r"""
import fcntl, json, os, sys, time
from bcc import BPF
read_high, write = os.pipe()
high = fcntl.fcntl(write, fcntl.F_DUPFD, 1000)
os.close(write)
read_low, write_low = os.pipe()
bpf = BPF(text="int hit(void *ctx) { return 0; }")
symbols = [line.split()[-1] for line in open(sys.argv[2])]
attached = 0
for name in symbols:
    if attached == int(sys.argv[1]):
        break
    try:
        bpf.attach_uprobe(name="c", sym=name, fn_name="hit")
        attached += 1
    except Exception:
        pass
print(json.dumps({"uprobes": attached, "high": read_high, "low": read_low, "write_low": write_low,
                  "write_high": high}), flush=True)
time.sleep(600)
"""

# libc functions a uprobe can be put on (exported, not inlined into their callers).
SYMBOLS = [
    "malloc",
    "free",
    "calloc",
    "realloc",
    "memcpy",
    "memset",
    "strlen",
    "strcmp",
    "open",
    "close",
    "read",
    "write",
    "fopen",
    "fclose",
    "printf",
    "puts",
    "getenv",
    "setenv",
    "qsort",
    "bsearch",
    "strtol",
    "strtoul",
    "atoi",
    "abs",
    "labs",
    "rand",
    "srand",
    "time",
    "clock",
    "sleep",
    "usleep",
    "nanosleep",
    "getpid",
    "getppid",
    "fork",
    "execve",
    "pipe",
    "dup",
    "dup2",
    "fcntl",
    "ioctl",
    "mmap",
    "munmap",
    "mprotect",
    "brk",
    "sbrk",
    "socket",
    "bind",
    "listen",
    "accept",
    "connect",
    "send",
    "recv",
    "sendto",
    "recvfrom",
    "select",
    "poll",
    "epoll_wait",
    "epoll_ctl",
    "epoll_create",
    "signal",
    "sigaction",
    "kill",
    "raise",
    "abort",
    "exit",
    "atexit",
    "strdup",
    "strndup",
    "strchr",
    "strrchr",
    "strstr",
    "strncmp",
    "strcpy",
    "strncpy",
    "strcat",
    "strncat",
    "memmove",
    "memcmp",
    "memchr",
    "toupper",
    "tolower",
    "isalpha",
    "isdigit",
    "isspace",
    "fgets",
    "fputs",
    "fread",
    "fwrite",
    "fseek",
    "ftell",
    "rewind",
    "fflush",
    "perror",
    "strerror",
]


def exit_order(uprobes: int, scratch: Path) -> dict[str, float]:
    names = scratch / "symbols.txt"
    names.write_text("\n".join(SYMBOLS) + "\n")
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(uprobes), str(names)], stdout=subprocess.PIPE
    )
    assert victim.stdout is not None
    started = json.loads(victim.stdout.readline())
    sys.path.insert(0, str(ROOT))
    from qpolicy.nvrm.rmctl import borrow_fd  # pidfd_getfd(2)

    ends = {
        "pipe at descriptor 1000": borrow_fd(victim.pid, started["high"]),
        f"pipe at descriptor {started['write_low']}": borrow_fd(victim.pid, started["low"]),
        "pidfd": os.pidfd_open(victim.pid),
    }
    names_of = {fd: name for name, fd in ends.items()}
    poller = select.poll()
    for fd in ends.values():
        poller.register(fd, select.POLLIN)
    killed = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    seen: dict[str, float] = {"uprobes": started["uprobes"]}
    while len(seen) < len(ends) + 1 and time.monotonic() - killed < 120:
        for fd, _ in poller.poll(1000):
            seen[names_of[fd]] = round((time.monotonic() - killed) * 1000, 1)
            poller.unregister(fd)
    victim.wait()
    seen["reaped"] = round((time.monotonic() - killed) * 1000, 1)
    return seen


def runtime_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def guard_cpu(seconds: float, scratch: Path, look_every_s: float | None) -> float:
    """Percent of a core a guard takes beside a sleeping stand-in daemon: the shipped one (woken
    by the alarm, a look a second), or one looking every ``look_every_s`` with no alarm."""
    sys.path.insert(0, str(ROOT))
    from qpolicy.enforcers.rm.guard import Guard
    from qpolicy.enforcers.rm.record import process_start_time

    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        if look_every_s is None:
            guard = Guard(scratch, pid=daemon.pid)
            process = guard.process
        else:
            start = process_start_time(daemon.pid)
            argv = [sys.executable, "-m", "qpolicy.enforcers.rm.guard", "--pid", str(daemon.pid),
                    "--start-time", str(start), "--state-dir", str(scratch),
                    "--look-every", str(look_every_s)]  # fmt: skip
            process = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.DEVNULL)
        assert process is not None
        time.sleep(2)  # started and asleep
        before = runtime_ns(process.pid)
        time.sleep(seconds)
        used = runtime_ns(process.pid) - before
        process.kill()
        process.wait()
        return 100 * used / 1e9 / seconds
    finally:
        daemon.kill()
        daemon.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uprobes", type=int, default=94)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/qpolicy-guard-alarm"))
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    print("after SIGKILL, ms:", json.dumps(exit_order(args.uprobes, args.scratch)))
    shipped = guard_cpu(args.seconds, args.scratch, None)
    polling = guard_cpu(args.seconds, args.scratch, 0.05)
    print(f"guard CPU over {args.seconds:g} s: {shipped:.3f} % of a core (alarm, a look a second), "
          f"{polling:.3f} % with no alarm, looking every 50 ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
