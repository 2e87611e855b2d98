"""How long PyTorch's launch call takes on this host, with nothing else on the GPU and no probe
loaded: the doctor's online request (a bf16 matmul), the same into a given output, and a tiny
elementwise op; each call, and each call with its synchronisation.

    python3 tools/gpu/launch_call.py --out launch.json [--n 4096] [--count 2000]

Why: the doctor's log of each request (docs/levers.md, thirty-first session) showed its launch
call returning 118-154 µs after the launch on lent H200s, alone as beside a trainer: a cost in
every online latency, solo's included, that no lever touches. This tells the call's part that
is the matmul's (cuBLAS's choice of kernel) from the part any launch pays on the host.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(op: Callable[[], object], sync: Callable[[], None], count: int) -> dict[str, float]:
    """p50 / p99 in µs of the call alone and of the call with its synchronisation; 2 ms apart,
    as the doctor's requests are (about 6.7 ms apart at 150 Hz: the GPU idle at each)."""
    calls, whole = [], []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        op()
        t1 = time.perf_counter_ns()
        sync()
        t2 = time.perf_counter_ns()
        calls.append((t1 - t0) / 1000)
        whole.append((t2 - t0) / 1000)
        time.sleep(0.002)
    calls.sort()
    whole.sort()

    def at(values: list[float], q: float) -> float:
        return round(values[int(q * (len(values) - 1))], 1)

    return {
        "call_p50_us": at(calls, 0.5),
        "call_p99_us": at(calls, 0.99),
        "done_p50_us": at(whole, 0.5),
        "done_p99_us": at(whole, 0.99),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    import torch

    from tools.gpu.hostinfo import host_facts

    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    x = torch.zeros(16, device="cuda")
    for _ in range(20):
        torch.matmul(a, b)
        x.add_(1)
    torch.cuda.synchronize()
    sync = torch.cuda.synchronize
    result: dict[str, Any] = {
        **host_facts(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "n": args.n,
        "matmul": timed(lambda: torch.matmul(a, b), sync, args.count),
        "matmul_out": timed(lambda: torch.matmul(a, b, out=c), sync, args.count),
        "add": timed(lambda: x.add_(1), sync, args.count),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
