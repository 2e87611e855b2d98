"""Where a profiled daemon's CPU went: a py-spy raw profile summed by thread and by function.

The daemon's CPU target (issue 14: <= 2 % of one core with 10 busy pods, GSP control time
included) sat at 1.6-2.1 % on the GPU hosts, and the in-process bench (tools/bench/daemon.py)
reads less, because its probe and driver are stand-ins. On the GPU host (tools/gpu/online-rows.sh,
row 10pods-profiled):

    py-spy record -p PID -r 1000 -d 28 --nonblocking --threads --function -f raw -o FILE

and here:

    python3 tools/gpu/profile_summary.py [--top 30] [--thread NAME] [--json] FILE[.xz]

Sample without ``--native`` and without stopping the daemon: py-spy unwinds native frames only
with the process stopped, and on an H100 host (call 53B, 2026-12-07) asked for 500 samples a
second it took 2 082 in 28 s, about 13 ms each, most of it with the daemon stopped: its CPU read
3.9 % against 1.9 % unprofiled, its main thread was seen active in a fifth of the samples while
it used 1.9 % of a core, and the samples put 7 % of that thread in the state file's stat, which
costs 8 us ten times a second (0.01 % of a core; measured here on Python 3.12). With
``--nonblocking`` py-spy reads the daemon's memory while it runs: on this machine, sampling the
in-process bench's daemon (tools/bench/daemon.py) at 200 Hz, the daemon read 1.28 % of a core
against 1.38 % unprofiled, and py-spy found it active in 0.9 % of its ticks. Time in a C call or
a syscall is then the calling Python frame's.

A raw profile is one line per distinct stack: the frames outermost first, separated by ``;``,
then a space and the number of samples. With ``--threads`` the outermost frame names the thread
(``thread (TID): name``). Samples of a thread blocked (its innermost Python frame a wait, or,
with native frames, a native call below it that blocks: a lock, a sleep, epoll) are counted apart
as waiting: py-spy reported such threads as active (with ``--native`` on this machine's Python
3.11), and a blocked thread uses no CPU.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The innermost Python frame of a thread blocked rather than running (a profile without native
# frames), and the native calls below it that block (with them).
WAITING = re.compile(
    r"^(Condition\.wait|Event\.wait|Thread\.join|BaseSelector\.select|EpollSelector\.select|"
    r"PollSelector\.select|SelectSelector\.select|_wait_for_tstate_lock) "
)
BLOCKING = frozenset(
    {
        "PyThread_acquire_lock_timed",
        "time_sleep",
        "clock_nanosleep",
        "nanosleep",
        "epoll_wait",
        "select",
        "poll",
        "ppoll",
        "accept",
        "accept4",
        "sem_wait",
        "sem_timedwait",
        "sem_clockwait",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
    }
)
FRAME = re.compile(r"^(?P<name>.*?)(?: \((?P<where>[^()]*)\))?$")
THREAD = re.compile(r"^(?:thread|process) \(")


@dataclass
class Summary:
    """One profile: its samples, by thread, and per function inclusive and innermost."""

    samples: int = 0
    waiting: int = 0
    threads: dict[str, int] = field(default_factory=dict)
    inclusive: list[tuple[str, int]] = field(default_factory=list)
    innermost: list[tuple[str, int]] = field(default_factory=list)


def frame_key(frame: str) -> str:
    """``name (path:line)`` as ``name file``: a function in a file, not a line of it."""
    match = FRAME.match(frame.strip())
    if match is None or not match.group("where"):
        return frame.strip()
    where = match.group("where").rsplit(":", 1)[0]
    return f"{match.group('name')} {Path(where).name}"


def parse_line(line: str) -> tuple[list[str], int] | None:
    """A raw line's frames (outermost first) and its count; None for a line that is not one."""
    line = line.rstrip("\n")
    if not line.strip():
        return None
    stack, sep, count = line.rpartition(" ")
    if not sep or not count.isdigit():
        return None
    return stack.split(";"), int(count)


def summarise(lines: list[str], top: int, thread_name: str | None = None) -> Summary:
    out = Summary()
    inclusive: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in lines:
        parsed = parse_line(line)
        if parsed is None:
            continue
        frames, count = parsed
        thread = "(no thread frame)"
        if frames and THREAD.match(frames[0]):
            # "thread (TID): name": threads of one name summed (a scrape's thread lives for
            # one request).
            thread = frames[0].strip().partition(": ")[2] or frames[0].strip()
            frames = frames[1:]
        if thread_name is not None and thread != thread_name:
            continue
        # An address with no symbol names nothing: counted under its library.
        keys = [re.sub(r"^0x[0-9a-f]+ ", "(no symbol) ", frame_key(f)) for f in frames]
        out.samples += count
        python = [i for i, k in enumerate(keys) if k.endswith(".py")]
        inner = python[-1] if python else -1
        below = {k.split(" ", 1)[0] for k in keys[inner + 1 :]}
        if (inner >= 0 and WAITING.match(keys[inner])) or below & BLOCKING:
            out.waiting += count
            continue
        threads[thread] += count
        for key in set(keys):
            if not key.startswith("(no symbol)"):
                inclusive[key] += count
        if keys:
            innermost[keys[-1]] += count
    out.threads = dict(threads.most_common())
    out.inclusive = inclusive.most_common(top)
    out.innermost = innermost.most_common(top)
    return out


def read(path: Path) -> list[str]:
    text = lzma.decompress(path.read_bytes()).decode() if path.suffix == ".xz" else path.read_text()
    return text.splitlines()


def render(summary: Summary) -> str:
    running = summary.samples - summary.waiting
    lines = [f"{summary.samples} samples, {running} running, {summary.waiting} waiting"]
    if running <= 0:
        return "\n".join(lines)
    lines.append("by thread:")
    lines += [f"  {n:7d} {100 * n / running:5.1f} %  {t}" for t, n in summary.threads.items()]
    lines.append("by function, inclusive (of running samples):")
    lines += [f"  {n:7d} {100 * n / running:5.1f} %  {k}" for k, n in summary.inclusive]
    lines.append("by function, innermost frame:")
    lines += [f"  {n:7d} {100 * n / running:5.1f} %  {k}" for k, n in summary.innermost]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30, help="functions listed (default 30)")
    parser.add_argument("--thread", help="only this thread's samples (its name, as listed)")
    parser.add_argument("--json", action="store_true", help="the summary as JSON")
    args = parser.parse_args(argv)
    if args.top < 1:
        print(f"profile_summary: --top must be at least 1, not {args.top}", file=sys.stderr)
        return 2
    try:
        lines = read(args.file)
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as e:
        print(f"profile_summary: cannot read {args.file}: {e}", file=sys.stderr)
        return 2
    summary = summarise(lines, args.top, args.thread)
    if summary.samples == 0:
        which = f" of thread {args.thread!r}" if args.thread is not None else ""
        print(f"profile_summary: no samples{which} in {args.file}", file=sys.stderr)
        return 2
    if args.json:
        payload: dict[str, Any] = asdict(summary)
        print(json.dumps(payload, indent=2))
    else:
        print(render(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
