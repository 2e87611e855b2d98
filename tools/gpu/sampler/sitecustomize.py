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

A thread whose work comes in bursts shorter than a sample (the daemon's loop) is charged at the
stack it waits in. With QPOLICY_SAMPLE_FUNCS=1 the sampler also times, once the daemon has run
PATCH_AFTER_S, every function of the qpolicy modules then loaded, and each callback of the loop,
with the calling thread's CPU clock (inclusive, per call: ~1 µs each, so the run's total is
higher than an unpatched one's; compare the parts, not the sum).
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


PATCH_AFTER_S = 8.0


def _describe(callback: object, depth: int = 0) -> str:
    """A loop callback's name: the first function inside it that is not a lambda or the loop's
    own repeating ``tick``."""
    name = getattr(callback, "__qualname__", type(callback).__name__)
    if depth < 4 and (name.endswith("<lambda>") or name.endswith("tick")):
        for cell in getattr(callback, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:
                continue
            if callable(inner):
                return _describe(inner, depth + 1)
    return f"{getattr(callback, '__module__', '?')}.{name}"


def _timed(key: str, func: object, table: dict[str, list[int]]) -> object:
    def wrapper(*args: object, **kwargs: object) -> object:
        start = time.thread_time_ns()
        try:
            return func(*args, **kwargs)  # type: ignore[operator]
        finally:
            entry = table.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += time.thread_time_ns() - start

    wrapper.__wrapped__ = func  # type: ignore[attr-defined]
    wrapper.__qualname__ = getattr(func, "__qualname__", key)
    return wrapper


def _patch(table: dict[str, list[int]], callbacks: dict[str, list[int]]) -> int:
    """Time every plain function and method of the loaded qpolicy modules, and the loop's
    callbacks. Returns how many were wrapped."""
    import inspect
    import types

    wrapped = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("qpolicy.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                setattr(module, attr, _timed(f"{name}.{attr}", value, table))
                wrapped += 1
            elif inspect.isclass(value) and value.__module__ == name:
                for meth, func in list(vars(value).items()):
                    if isinstance(func, types.FunctionType) and not meth.startswith("__"):
                        key = f"{name}.{value.__qualname__}.{meth}"
                        setattr(value, meth, _timed(key, func, table))
                        wrapped += 1
    loop = sys.modules.get("qpolicy.runtime.realtime")
    if loop is not None:
        original = loop.RealtimeLoop.__dict__["_call"]
        original = getattr(original, "__wrapped__", original)

        def _call(self: object, callback: object) -> None:
            start = time.thread_time_ns()
            try:
                original(self, callback)
            finally:
                entry = callbacks.setdefault(_describe(callback), [0, 0])
                entry[0] += 1
                entry[1] += time.thread_time_ns() - start

        loop.RealtimeLoop._call = _call
    return wrapped


def _table(table: dict[str, list[int]]) -> dict[str, list[float]]:
    rows = sorted(table.items(), key=lambda kv: -kv[1][1])[:300]
    return {k: [calls, ns / 1e9] for k, (calls, ns) in rows}


def _run(out: str) -> None:
    last: dict[int, int] = {}
    threads_ns: dict[str, int] = {}
    stacks_ns: dict[str, int] = {}
    started = time.monotonic()
    written = started
    functions: dict[str, list[int]] = {}
    callbacks: dict[str, list[int]] = {}
    patch = os.environ.get("QPOLICY_SAMPLE_FUNCS") == "1"
    patched: int | None = None

    def write() -> None:
        document = {
            "pid": os.getpid(),
            "seconds": time.monotonic() - started,
            "sample_ms": SAMPLE_MS,
            "threads_cpu_s": {k: v / 1e9 for k, v in sorted(threads_ns.items())},
            "stacks_cpu_s": {
                k: v / 1e9 for k, v in sorted(stacks_ns.items(), key=lambda kv: -kv[1])[:400]
            },
            "patched_functions": patched,
            # [calls, CPU seconds], from the patch on (inclusive).
            "callbacks": _table(callbacks),
            "functions": _table(functions),
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
        if patch and patched is None and time.monotonic() - started >= PATCH_AFTER_S:
            patched = _patch(functions, callbacks)
        if time.monotonic() - written >= WRITE_EVERY_S:
            written = time.monotonic()
            write()


_out = os.environ.get("QPOLICY_SAMPLE_OUT")
if _out and _is_daemon():
    threading.Thread(target=_run, args=(_out,), name="qpolicy-sampler", daemon=True).start()
