"""Where a qpolicy daemon's CPU goes, per thread, on a host with no profiler to carry.

Put this folder first on PYTHONPATH and set QPOLICY_SAMPLE_OUT to a file: every Python process
whose command line is ``... qpolicy daemon ...`` then samples itself. Every SAMPLE_MS (10) it reads
each thread's CPU clock and its stack, and charges the CPU the thread used since the last
sample to the stack it is in now (a thread that ran 1 ms of a 10 ms gap is charged 1 ms). The
totals per thread name and per stack are written to the file every few seconds and at exit, as
JSON. cProfile sees only the thread it runs in, and on Python 3.12 (the GPU hosts') a second
thread's profiler cannot be enabled (BENCHMARKS.md, 2026-11-26); py-spy does not fit in what a
device call carries beside bcc.

The sampler's own thread is listed too, so its cost can be subtracted.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import threading
import time
import traceback

# QPOLICY_SAMPLE_MS: a sample every 5 ms cost 5 % of a core next to a spinning thread.
SAMPLE_MS = float(os.environ.get("QPOLICY_SAMPLE_MS", "10"))
WRITE_EVERY_S = 5.0


def _is_daemon() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(a == b"qpolicy" and b == b"daemon" for a, b in itertools.pairwise(argv))


def _cpu_ns(ident: int) -> int | None:
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    except (OSError, OverflowError):
        return None  # the thread ended between the listing and the read


def _stack(frame: object) -> str:
    entries = traceback.extract_stack(frame)  # type: ignore[arg-type]
    return ";".join(f"{os.path.basename(e.filename)}:{e.name}" for e in entries[-12:])


def _run(out: str) -> None:
    last: dict[int, int] = {}
    threads_ns: dict[str, int] = {}
    stacks_ns: dict[str, int] = {}
    started = time.monotonic()
    written = started

    def write() -> None:
        document = {
            "pid": os.getpid(),
            "seconds": time.monotonic() - started,
            "sample_ms": SAMPLE_MS,
            "threads_cpu_s": {k: v / 1e9 for k, v in sorted(threads_ns.items())},
            "stacks_cpu_s": {
                k: v / 1e9 for k, v in sorted(stacks_ns.items(), key=lambda kv: -kv[1])[:400]
            },
        }
        tmp = f"{out}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(document, f, indent=1)
        os.replace(tmp, f"{out}.{os.getpid()}.json")

    atexit.register(write)
    while True:
        time.sleep(SAMPLE_MS / 1000)
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            now = _cpu_ns(ident)
            if now is None:
                continue
            used = now - last.get(ident, now)
            last[ident] = now
            if used <= 0:
                continue
            name = names.get(ident, str(ident))
            threads_ns[name] = threads_ns.get(name, 0) + used
            key = f"{name}|{_stack(frame)}"
            stacks_ns[key] = stacks_ns.get(key, 0) + used
        if time.monotonic() - written >= WRITE_EVERY_S:
            written = time.monotonic()
            write()


_out = os.environ.get("QPOLICY_SAMPLE_OUT")
if _out and _is_daemon():
    threading.Thread(target=_run, args=(_out,), name="qpolicy-sampler", daemon=True).start()
