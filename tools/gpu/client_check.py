"""What checking a client handle by making a client at it costs, and whether it writes to the
kernel log (qpolicy.nvrm.rmctl.ClientCheck, which qpolicy/enforcers/rm/unseen.py's searches use).

A question sent to a client handle that does not exist writes a kernel log line (call 23I, an
H200). ClientCheck instead allocates a client *at* the handle on the daemon's own
``/dev/nvidiactl``: RM answers NV_ERR_INSERT_DUPLICATE_NAME where a client holds it, otherwise
the client is made and freed at once. Here, on a real GPU:

1. ``--free N`` clients are made and freed (as monitoring makes them): handles no client holds;
2. ``--held M`` clients are made and kept open on another descriptor (another file's clients);
3. each of those handles is checked, timed, and its answer compared with what it is; then the
   same free handles are asked the old way (GET_HANDLE_INFO, ``--ask``, 0 to skip), which logs;
4. the kernel log's length is read around each step (``dmesg``).

As root on a GPU machine:

    python3 tools/gpu/client_check.py --free 2000 --held 50 --ask 100 --out client-check.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.nvrm import abi, rmctl


def log_lines() -> int | None:
    """The kernel log's length in lines (None where dmesg cannot be read)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return len(out.splitlines())


def timed(check: Callable[[int], bool | None], handles: Sequence[int]) -> dict[str, Any]:
    """Each handle checked: the answers counted, and the cost per check in microseconds."""
    answers: dict[str, int] = {}
    costs: list[float] = []
    for handle in handles:
        start = time.perf_counter()
        answer = check(handle)
        costs.append((time.perf_counter() - start) * 1e6)
        answers[str(answer)] = answers.get(str(answer), 0) + 1
    return {"count": len(handles), "answers": answers, "us": summary(costs)}


def summary(costs: Sequence[float]) -> dict[str, float] | None:
    if not costs:
        return None
    ordered = sorted(costs)
    return {
        "median": round(statistics.median(ordered), 2),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


def verdict(result: dict[str, Any]) -> list[str]:
    """What must hold: free handles answered False, held ones True, no log line from either."""
    problems = []
    if result["free"]["answers"] != {"False": result["free"]["count"]}:
        problems.append(f"free handles answered {result['free']['answers']}")
    if result["held"]["answers"] != {"True": result["held"]["count"]}:
        problems.append(f"held handles answered {result['held']['answers']}")
    logged = result["log_lines"].get("checks")
    if logged is None:
        problems.append("the kernel log could not be read")
    elif logged:
        problems.append(f"the checks wrote {logged} kernel log line(s)")
    return problems


def make_clients(count: int, fd: int) -> list[int]:
    """``count`` clients made on ``fd`` (RM numbers them)."""
    made = []
    for _ in range(count):
        handle = rmctl.alloc_client(fd)
        if handle is None:
            raise RuntimeError("RM refused to allocate a client")
        made.append(handle)
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--free", type=int, default=2000)
    parser.add_argument("--held", type=int, default=50)
    parser.add_argument("--ask", type=int, default=100, help="free handles asked the old way")
    parser.add_argument("--out", type=Path, default=Path("client-check.json"))
    args = parser.parse_args(argv)
    if min(args.free, args.held, args.ask) < 0 or args.ask > args.free:
        parser.error("--free, --held and --ask must be 0 or more, --ask at most --free")
    freed_fd = os.open("/dev/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
    free = make_clients(args.free, freed_fd)
    os.close(freed_fd)  # frees them all
    held_fd = os.open("/dev/nvidiactl", os.O_RDWR | os.O_CLOEXEC)
    check = rmctl.ClientCheck()
    result: dict[str, Any] = {"log_lines": {}}
    try:
        held = make_clients(args.held, held_fd)
        before = log_lines()
        result["free"] = timed(check.in_use, free)
        result["held"] = timed(check.in_use, held)
        after = log_lines()
        result["log_lines"]["checks"] = None if None in (before, after) else after - before
        asker = rmctl.HandleAsker(check.fd)
        asked = free[: args.ask]
        result["asked"] = timed(
            lambda h: asker.info(h, h, abi.HANDLE_INFO_INDEX_CLASSID) is not None, asked
        )
        last = log_lines()
        result["log_lines"]["asked"] = None if None in (after, last) else last - after
    finally:
        check.close()
        os.close(held_fd)
    result["problems"] = verdict(result)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
