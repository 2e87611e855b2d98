"""When the GPU moves GP_GET in USERD, against when the kernels it fetched run.

qgpu.ko reads a gated channel's USERD (GP_GET, GP_PUT) to tell whether it has work; nvmock
moves GP_GET when an entry is fetched, before its kernel runs (kmod/nvmock/CONFORMANCE.md,
"GP_GET"). This measures the real GPU: a PyTorch process runs under tools/gpu/userd_watch.c (an
LD_PRELOAD library that finds each of its channels' USERD and samples GP_GET/GP_PUT from a
thread), launches long bf16 matmuls one at a time (and then in chains of several, launched back
to back), and times each launch and its end with the same clock. Per request: when GP_PUT moved
after the launch, when GP_GET caught up with it, and when the work ended. Then two trainer
loops of 3 s (synced at the end only, and after each matmul): the part of each in which the
channel read pending, which is what qgpu takes for busy.

The watcher also samples the pushbuffer's Put and Get and TopLevelGet (clc86f.h), to learn
whether any word of USERD stays behind while fetched work runs (a sign of completion qgpu could
read): per request, when the pushbuffer's Get reached its Put and when TopLevelGet last moved,
against the request's end; per trainer loop, the part in which Get != Put.

On a GPU machine with PyTorch and gcc (no root needed; nothing but the process's own USERD is
read):

    python3 tools/gpu/userd_fetch.py --out userd-fetch.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def worker(n: int, requests: int, gap_ms: float, chain: int, timeline: str) -> None:
    """In the watched process: launch, time, and stop the watcher before CUDA goes away."""
    import torch  # the GPU machine's; not a dependency of qpolicy

    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ x
    torch.cuda.synchronize()
    rows = []
    for length in (1, chain):
        for _ in range(requests):
            time.sleep(gap_ms / 1000)
            t0 = time.monotonic_ns()
            for _ in range(length):
                x @ x
            t1 = time.monotonic_ns()
            torch.cuda.synchronize()
            rows.append({"kernels": length, "t0": t0, "t1": t1, "t2": time.monotonic_ns()})
    # A trainer's loop for TRAINER_S seconds: matmuls launched as fast as the CPU can, synced
    # at the end only (the CPU runs ahead), or after each one (a loop bound by its results).
    trainers = []
    for sync_each in (False, True):
        time.sleep(gap_ms / 1000)
        t0, iterations = time.monotonic_ns(), 0
        while time.monotonic_ns() - t0 < TRAINER_S * 1e9:
            x @ x
            iterations += 1
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        trainers.append(
            {"sync_each": sync_each, "t0": t0, "t2": time.monotonic_ns(), "iterations": iterations}
        )
    ctypes.CDLL(None).userd_watch_stop()
    Path(timeline).write_text(json.dumps({"requests": rows, "trainers": trainers}))


TRAINER_S = 3.0
# What userd_watch.c's watch() loads from a slot at each read: GP_GET, Put and TopLevelGet.
# tools/gpu/userd_read_cost.py divides the watcher's time by reads times this.
LOADS_PER_READ = 3


def pending_share(events: list[tuple[int, int, int]], t0: int, t2: int) -> float | None:
    """The part of [t0, t2] in which GP_GET != GP_PUT on a channel, from its change events."""
    state = None
    for t, get, put in events:
        if t > t0:
            break
        state = get != put
    pending, last = 0, t0
    for t, get, put in events:
        if t <= t0:
            continue
        if t >= t2:
            break
        if state:
            pending += t - last
        state, last = get != put, t
    if state:
        pending += t2 - last
    return pending / (t2 - t0) if t2 > t0 else None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Events = dict[int, list[tuple[int, int, int]]]


def events_by_channel(watch: dict[str, Any], words: tuple[int, int] = (2, 3)) -> Events:
    """The watcher's changes, (time, a, b) in order, by channel, where a and b are the event's
    fields at ``words``: GP_GET and GP_PUT by default, (5, 4) for the pushbuffer's Get and Put.
    An event is [time, channel, GP_GET, GP_PUT, Put, Get, TopLevelGet]; recordings before the
    watcher read the pushbuffer words have the first four only. A change of other words only
    repeats the pair, which the analyses take as it is."""
    by_channel: Events = {}
    for event in watch["events"]:
        if max(words) >= len(event):
            raise ValueError(f"event {event!r} has no field {max(words)}")
        by_channel.setdefault(event[1], []).append((event[0], event[words[0]], event[words[1]]))
    return by_channel


def analyse_pushbuffer(
    pushbuffer: Events,
    top: dict[int, list[tuple[int, int]]],
    requests: list[dict[str, Any]],
    rows: list[dict[str, int]],
) -> dict[str, Any]:
    """Per request, on the channel analyse() found for it: when the pushbuffer's Get reached the
    Put it had at the request's end, and when TopLevelGet last moved before that end, both as a
    share of the request (1.0: at its end, as a sign of completion would be)."""
    out: dict[str, Any] = {}
    for length in sorted({r["kernels"] for r in rows}):
        caught, top_last, pending_at_end = [], [], 0
        for row, req in zip(rows, requests, strict=True):
            if row["kernels"] != length or req.get("channel") is None:
                continue
            t0, t2 = row["t0"], row["t2"]
            events = pushbuffer.get(req["channel"], [])
            at_end = [e for e in events if e[0] <= t2]
            if not at_end:
                continue
            put = at_end[-1][2]
            pending_at_end += at_end[-1][1] != put
            hit = next((e[0] for e in events if e[0] >= t0 and e[1] == put), None)
            if hit is not None:
                caught.append((hit - t0) / (t2 - t0))
            moves = [t for t, _ in top.get(req["channel"], []) if t0 <= t <= t2]
            if moves:
                top_last.append((moves[-1] - t0) / (t2 - t0))
        out[f"{length} kernel(s) a request"] = {
            "pb_caught_up": len(caught),
            "pb_caught_up_share_p50": pct(caught, 0.5),
            "pb_caught_up_share_max": max(caught) if caught else None,
            "pb_pending_at_end": pending_at_end,
            "top_level_get_moved": len(top_last),
            "top_level_get_last_share_p50": pct(top_last, 0.5),
            "top_level_get_last_share_max": max(top_last) if top_last else None,
        }
    return out


def top_level_gets(watch: dict[str, Any]) -> dict[int, list[tuple[int, int]]]:
    """(time, TopLevelGet) at each change of it, by channel."""
    out: dict[int, list[tuple[int, int]]] = {}
    for event in watch["events"]:
        if len(event) < 7:
            continue
        seen = out.setdefault(event[1], [])
        if not seen or seen[-1][1] != event[6]:
            seen.append((event[0], event[6]))
    return out


def analyse(by_channel: Events, rows: list[dict[str, int]]) -> dict[str, Any]:
    """Per request, on the channel whose GP_PUT moved first after the launch began: when GP_PUT
    moved, when GP_GET reached that GP_PUT, and the request's end (all from its launch)."""
    out = []
    for row in rows:
        best = None
        for channel, events in by_channel.items():
            before = [e for e in events if e[0] < row["t0"]]
            put0 = before[-1][2] if before else None
            moved = [e for e in events if e[0] >= row["t0"] and e[2] != put0]
            if moved and (best is None or moved[0][0] < best[1][0][0]):
                best = (channel, moved)
        if best is None:
            out.append({**row, "channel": None})
            continue
        channel, moved = best
        # the last GP_PUT this request wrote: the last change before its end
        final_put = [e for e in moved if e[0] <= row["t2"]][-1][2]
        caught = next((e[0] for e in moved if e[1] == final_put and e[2] == final_put), None)
        end = row["t2"] - row["t0"]
        out.append(
            {
                "kernels": row["kernels"],
                "channel": channel,
                "put_us": (moved[0][0] - row["t0"]) / 1e3,
                "caught_up_us": None if caught is None else (caught - row["t0"]) / 1e3,
                "end_us": end / 1e3,
                "entries": (final_put - moved[0][2]) % (1 << 32) + 1,
            }
        )
    summary: dict[str, Any] = {}
    for length in sorted({r["kernels"] for r in rows}):
        seen = [r for r in out if r["kernels"] == length and r.get("channel") is not None]
        caught = [r for r in seen if r["caught_up_us"] is not None]
        share = [r["caught_up_us"] / r["end_us"] for r in caught]
        summary[f"{length} kernel(s) a request"] = {
            "requests": len([r for r in rows if r["kernels"] == length]),
            "seen": len(seen),
            "caught_up": len(caught),
            "put_us_p50": pct([r["put_us"] for r in seen], 0.5),
            "caught_up_us_p50": pct([r["caught_up_us"] for r in caught], 0.5),
            "caught_up_us_p90": pct([r["caught_up_us"] for r in caught], 0.9),
            "end_us_p50": pct([r["end_us"] for r in seen], 0.5),
            "caught_up_share_of_request_p50": pct(share, 0.5),
            "caught_up_share_of_request_max": max(share) if share else None,
            "caught_up_before_half": sum(1 for s in share if s < 0.5),
        }
    return {"summary": summary, "requests": out}


def analyse_trainers(by_channel: Events, trainers: list[dict[str, Any]]) -> dict[str, Any]:
    """For each trainer loop, on the channel that changed most during it: the part of the loop
    in which it read pending (GP_GET != GP_PUT), which is what qgpu sees as busy."""
    out = {}
    for loop in trainers:
        t0, t2 = loop["t0"], loop["t2"]
        busiest = max(
            by_channel.items(),
            key=lambda item: sum(1 for e in item[1] if t0 <= e[0] <= t2),
            default=None,
        )
        name = "synced after each matmul" if loop["sync_each"] else "synced at the end only"
        out[f"trainer, {name}"] = {
            "iterations": loop["iterations"],
            "seconds": (t2 - t0) / 1e9,
            "channel": busiest[0] if busiest else None,
            "pending_share": pending_share(busiest[1], t0, t2) if busiest else None,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where the result goes (JSON)")
    parser.add_argument("--n", type=int, default=16384, help="matmul size (bf16)")
    parser.add_argument("--requests", type=int, default=100, help="requests of each shape")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="idle time before each")
    parser.add_argument("--chain", type=int, default=4, help="kernels a chained request launches")
    parser.add_argument("--worker", metavar="TIMELINE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.n < 1 or args.requests < 1 or args.chain < 1 or args.gap_ms < 0:
        parser.error("--n, --requests and --chain must be positive, --gap-ms not negative")
    if args.worker:
        worker(args.n, args.requests, args.gap_ms, args.chain, args.worker)
        return 0
    if not args.out:
        parser.error("--out is required")
    with tempfile.TemporaryDirectory() as tmp:
        library = Path(tmp) / "userd_watch.so"
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(HERE / "userd_watch.c"),
             "-ldl", "-lpthread"],
            check=True,
        )  # fmt: skip
        watch_path, timeline = Path(tmp) / "watch.json", Path(tmp) / "timeline.json"
        env = dict(os.environ, LD_PRELOAD=str(library), USERD_WATCH_OUT=str(watch_path))
        argv = [sys.executable, __file__, "--worker", str(timeline), "--n", str(args.n)]
        argv += ["--requests", str(args.requests), "--gap-ms", str(args.gap_ms)]
        argv += ["--chain", str(args.chain)]
        subprocess.run(argv, env=env, check=True)
        watch = json.loads(watch_path.read_text())
        recorded = json.loads(timeline.read_text())
    rows = recorded["requests"]
    by_channel = events_by_channel(watch)
    result = analyse(by_channel, rows)
    result["summary"].update(analyse_trainers(by_channel, recorded["trainers"]))
    pushbuffer = events_by_channel(watch, (5, 4))
    result["pushbuffer"] = analyse_pushbuffer(
        pushbuffer, top_level_gets(watch), result["requests"], rows
    )
    result["pushbuffer"].update(analyse_trainers(pushbuffer, recorded["trainers"]))
    sys.path.insert(0, str(HERE.parents[1]))
    from tools.gpu.hostinfo import host_facts

    report = {
        **host_facts(),
        "n": args.n,
        "gap_ms": args.gap_ms,
        "reads": watch["reads"],
        "loads_per_read": LOADS_PER_READ,
        "events": len(watch["events"]),
        "events_lost": watch["events_lost"],
        "channels": watch["channels"],
        **result,
        "raw_events": watch["events"],
        "raw_timeline": rows,
        "raw_trainers": recorded["trainers"],
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"channels": len(watch["channels"]), **result["summary"],
                      "pushbuffer": result["pushbuffer"]}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
