"""The doctor's own workloads: a saturating trainer and an online request stream (PyTorch).

Run as ``python3 -m qpolicy.doctor.workload trainer|online ...`` by the doctor, one process each,
so that each has its own CUDA context and channel groups, as tenants do. Both print one JSON object
per line on stdout as they go:

* ``{"ready": pid}`` once CUDA is initialised and warm (its objects exist; CUDA's own timeslice is
  set), then
* the trainer: ``{"t": wall time, "done": matmuls so far}`` after each synchronised batch;
* the online stream: ``{"ask": n}`` before each request, then waits for a line on stdin (the doctor
  may send a control first), and ``{"t": arrival, "ms": latency}`` once the request's result is
  back. The latency runs from the request's arrival (its slot in the schedule) to the end of its
  synchronisation, so time spent waiting for the doctor's answer counts, in every phase alike.
  The line also holds the request's launch, the return of its launch call (its work and the
  doorbell written) and the end of its synchronisation on CLOCK_MONOTONIC_RAW in ns
  (``"launch"``, ``"enqueued"``, ``"done"``), the clock RM correlates with the GPU's timer
  (qpolicy.nvrm.fecs), to place the GPU's context switches in each request.

The trainer waits for a line on stdin before its first batch when started with ``--wait``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _say(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def _operands(torch: Any, n: int) -> tuple[Any, Any]:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    return a, b


def trainer(n: int, sync_every: int, wait: bool) -> None:
    import torch

    a, b = _operands(torch, n)
    _say({"ready": os.getpid()})
    if wait:
        sys.stdin.readline()
    done = 0
    while True:
        for _ in range(sync_every):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        done += sync_every
        _say({"t": time.time(), "done": done})


def online(n: int, hz: float) -> None:
    import torch

    a, b = _operands(torch, n)
    _say({"ready": os.getpid()})
    interval = 1.0 / hz
    next_at = time.perf_counter()
    asked = 0
    while True:
        now = time.perf_counter()
        if next_at > now:
            time.sleep(next_at - now)
        arrival, wall = next_at, time.time() - (time.perf_counter() - next_at)
        asked += 1
        _say({"ask": asked})
        if not sys.stdin.readline():
            return  # the doctor is gone
        launch = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        torch.matmul(a, b)
        enqueued = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        torch.cuda.synchronize()
        done = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        ms = (time.perf_counter() - arrival) * 1000
        _say({"t": wall, "ms": ms, "launch": launch, "enqueued": enqueued, "done": done})
        next_at += interval  # a late request delays the next: its latency shows the queue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    t = sub.add_parser("trainer")
    t.add_argument("--n", type=int, default=8192)
    t.add_argument("--sync-every", type=int, default=4)
    t.add_argument("--wait", action="store_true")
    o = sub.add_parser("online")
    o.add_argument("--n", type=int, default=4096)
    o.add_argument("--hz", type=float, default=150.0)
    args = parser.parse_args(argv)
    try:
        if args.kind == "trainer":
            trainer(args.n, args.sync_every, args.wait)
        else:
            online(args.n, args.hz)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
