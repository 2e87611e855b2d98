"""A PyTorch bf16 matmul loop, the workload of docs/gpu-measurements.md, for the GPU tier.

    python3 matmul.py --n 4096 --seconds 10 [--sync-every 8] [--count-kernels] [--hold]
    python3 matmul.py --n 32768 --sync-every 1 --wait poll        # poll the stream, 0.5 ms apart
    python3 matmul.py --n 32768 --sync-every 1 --wait host --host-ms 80
                                            # 80 ms of host work after each launch, then wait
    python3 matmul.py --n 32768 --sync-every 1 --wait copy  # a synchronous copy of the result
    python3 matmul.py --n 4096 --requests-hz 50 --seconds 10     # online: one matmul per request
    python3 matmul.py --n 4096 --requests-hz 50 --plain           # the same, no events around it
    python3 matmul.py --n 4096 --requests-hz 50 --plain --request-kernels 4 --request-gap-ms 0.5
                                            # a request of 4 matmuls, 0.5 ms of host work between

Prints one JSON line: iterations, seconds, it/s (saturating) or request latencies and how late
the host issued each request (online), and with --count-kernels the number of GPU kernels
PyTorch's profiler (CUPTI) saw, which the probe's launch count is checked against. --hold waits
for a line on stdin before exiting, so whoever watches the process can read its state while it
still holds its GPU objects.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)] if ordered else 0.0


def _wait_until(start_at: float | None) -> None:
    """Sleep until the wall-clock time ``start_at`` (after CUDA init, so runs overlap exactly)."""
    if start_at is not None:
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(delay)


def _busy_wait(seconds: float) -> None:
    """Host work of ``seconds``: a spin, as a sleep this short oversleeps by tens of µs."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _copy_to_host() -> Any:
    """A function that copies a tensor's first 4 bytes to the host with libcuda's synchronous
    cuMemcpyDtoH_v2 (not PyTorch's copy, which is an async copy and a stream synchronize).
    Issued on the legacy default stream, where PyTorch launches, so it returns once the kernel
    that wrote the tensor is done."""
    import ctypes

    libcuda = ctypes.CDLL("libcuda.so.1")
    memcpy = libcuda.cuMemcpyDtoH_v2
    memcpy.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t)
    memcpy.restype = ctypes.c_int
    host = ctypes.create_string_buffer(4)

    def copy_back(tensor: Any) -> None:
        status = memcpy(host, tensor.data_ptr(), 4)
        if status != 0:
            raise RuntimeError(f"cuMemcpyDtoH_v2 returned CUDA error {status}")

    return copy_back


def saturate(
    torch: Any,
    n: int,
    seconds: float,
    sync_every: int,
    iters: int | None,
    start_at: float | None = None,
    timeline: bool = False,
    wait: str = "sync",
    host_ms: float = 0.0,
) -> dict[str, Any]:
    """Matmuls for ``seconds``, waiting for the results every ``sync_every``: in
    torch.cuda.synchronize() (``wait`` "sync"); by polling the stream every 0.5 ms ("poll":
    cudaStreamQuery, which a synchronize-free event loop uses); or after ``host_ms`` of host
    work that overlaps the kernels ("host": the process launches nothing and waits in no call
    meanwhile); or in a synchronous copy of the last result to the host ("copy": libcuda's
    cuMemcpyDtoH_v2, the CUDA samples' ``kernel<<<...>>>; cudaMemcpy(D2H)``, which waits for
    the kernel inside the copy and makes no synchronize call)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    copy_back = _copy_to_host() if wait == "copy" else None
    _wait_until(start_at)
    done = 0
    syncs: list[float] = []
    start = time.perf_counter()
    wall_start = time.time()
    deadline = start + seconds
    while (iters is None and time.perf_counter() < deadline) or (
        iters is not None and done < iters
    ):
        for _ in range(sync_every):
            c = torch.matmul(a, b)
        if copy_back is not None:
            copy_back(c)
        elif wait == "poll":
            # No synchronize call at all, even once the stream says done.
            stream = torch.cuda.current_stream()
            while not stream.query():
                time.sleep(0.0005)
        else:
            if wait == "host":
                _busy_wait(host_ms / 1000)
            torch.cuda.synchronize()
        done += sync_every
        if timeline:
            syncs.append(time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {
        "iterations": done,
        "seconds": elapsed,
        "it_per_s": done / elapsed,
        "wall_start": wall_start,
    }
    if timeline:
        # When each batch of sync_every matmuls finished, relative to wall_start.
        result["timeline"] = [round(t, 5) for t in syncs]
    return result


def requests(
    torch: Any,
    n: int,
    seconds: float,
    rate_hz: float,
    start_at: float | None = None,
    plain: bool = False,
    kernels: int = 1,
    gap_ms: float = 0.0,
) -> dict[str, Any]:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    _wait_until(start_at)
    interval = 1.0 / rate_hz
    latencies: list[float] = []
    # Each request's time on the GPU, from an event before its matmul to one after it (GPU
    # timestamps): what is left of the latency is the wait for the GPU (the switch away from
    # whatever ran, the launch); what the run itself lost is the other tenant's doing in caches,
    # clocks and memory, which no scheduling lever removes. The events are work of their own on the
    # request's channel, submitted apart from the matmul: the GPU can run the first, find the
    # channel empty and switch away before the matmul arrives. --plain leaves them out, so the
    # request is the matmul alone (the latency is then all that is measured).
    runs: list[float] = []
    # How late each request was issued past its arrival: the host's oversleep (a vCPU woken late
    # by its hypervisor, timer slack) or a backlog behind the request before it. Its latency less
    # this is the time from issue to done, the part a GPU scheduler can act on.
    late: list[float] = []
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    next_at = start
    while next_at < start + seconds:
        now = time.perf_counter()
        if next_at > now:
            time.sleep(next_at - now)
        arrival = next_at
        late.append((time.perf_counter() - arrival) * 1000)
        # A request of several kernels, each waited for and followed by host work (a model's
        # steps with pre- and post-processing between them): the channel empties between them,
        # so each kernel is one more switch from whatever else holds the GPU.
        for _ in range(kernels - 1):
            torch.matmul(a, b)
            torch.cuda.synchronize()
            _busy_wait(gap_ms / 1000)
        if plain:
            torch.matmul(a, b)
        else:
            before.record()
            torch.matmul(a, b)
            after.record()
        torch.cuda.synchronize()
        latencies.append((time.perf_counter() - arrival) * 1000)
        if not plain:
            runs.append(before.elapsed_time(after))
        next_at += interval
    # Timed requests only: each request's run on the GPU, between its events.
    timed = (
        {}
        if plain
        else {
            "run_p50_ms": _percentile(runs, 0.50),
            "run_p99_ms": _percentile(runs, 0.99),
            "runs_ms": [round(x, 4) for x in runs],
        }
    )
    return {
        "requests": len(latencies),
        "seconds": time.perf_counter() - start,
        "p50_ms": _percentile(latencies, 0.50),
        "p90_ms": _percentile(latencies, 0.90),
        "p99_ms": _percentile(latencies, 0.99),
        "p999_ms": _percentile(latencies, 0.999),
        "mean_ms": sum(latencies) / len(latencies),
        "plain": plain,
        "kernels": kernels,
        "gap_ms": gap_ms,
        # Every request, in order: kept with the results (the percentiles can be checked).
        "latencies_ms": [round(x, 4) for x in latencies],
        "late_ms": [round(x, 4) for x in late],
        **timed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--iters", type=int, default=None, help="stop after this many matmuls")
    parser.add_argument("--sync-every", type=int, default=8)
    parser.add_argument(
        "--wait",
        choices=("sync", "poll", "host", "copy"),
        default="sync",
        help="how results are waited for",
    )
    parser.add_argument("--host-ms", type=float, default=0.0, help="--wait host: host work (ms)")
    parser.add_argument("--requests-hz", type=float, default=None)
    parser.add_argument(
        "--plain", action="store_true", help="online: no timing events around each request"
    )
    parser.add_argument(
        "--request-kernels", type=int, default=1, help="online: matmuls per request"
    )
    parser.add_argument(
        "--request-gap-ms", type=float, default=0.0, help="online: host work between them"
    )
    parser.add_argument("--count-kernels", action="store_true")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--label", default="")
    parser.add_argument("--start-at", type=float, default=None, help="wall-clock start (epoch s)")
    parser.add_argument("--timeline", action="store_true", help="record when each batch ended")
    args = parser.parse_args()
    if args.request_kernels < 1:
        parser.error(f"--request-kernels {args.request_kernels}: must be at least 1")
    if args.host_ms < 0:
        parser.error(f"--host-ms {args.host_ms}: must not be negative")
    if args.request_gap_ms < 0:
        parser.error(f"--request-gap-ms {args.request_gap_ms}: must not be negative")

    import torch

    profiler = None
    if args.count_kernels:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CUDA])
        profiler.__enter__()
    if args.requests_hz:
        result = requests(
            torch,
            args.n,
            args.seconds,
            args.requests_hz,
            args.start_at,
            plain=args.plain,
            kernels=args.request_kernels,
            gap_ms=args.request_gap_ms,
        )
    else:
        result = saturate(
            torch,
            args.n,
            args.seconds,
            args.sync_every,
            args.iters,
            args.start_at,
            args.timeline,
            wait=args.wait,
            host_ms=args.host_ms,
        )
    result.update({"n": args.n, "label": args.label, "pid": __import__("os").getpid()})
    if profiler is not None:
        torch.cuda.synchronize()
        profiler.__exit__(None, None, None)
        kernels = [
            e
            for e in profiler.events()
            if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name
        ]
        result["kernels_profiled"] = len(kernels)
    print(json.dumps(result), flush=True)
    if args.hold:
        sys.stdin.readline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
