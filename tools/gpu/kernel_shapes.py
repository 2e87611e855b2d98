"""The CUDA kernels behind the bench's bf16 matmuls: name, grid, block, duration, and the GPU's
SM count, from PyTorch's profiler (Kineto's trace records each kernel's launch shape).

    python3 tools/gpu/kernel_shapes.py --out shapes.json [--sizes 2048,4096,8192]

Why: next to an 8192 trainer, MPS (one shared context, no context switch) left an online request
waiting about as long as native time-slicing, while next to a 2048 trainer it served requests at
solo latency (BENCHMARKS.md, 2026-11-27, twelfth session). A kernel whose grid is one block per SM
(a persistent kernel) holds every SM until it ends, and MPS can only place another client's
blocks on an SM a block has left. This records whether the trainers' kernels are of that kind.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any


def shapes(n: int, iterations: int) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("cat") != "kernel":
            continue
        args = event.get("args", {})
        row = kernels.setdefault(
            event["name"],
            {
                "name": event["name"],
                "grid": args.get("grid"),
                "block": args.get("block"),
                "blocks_per_sm": args.get("blocks per SM"),
                "registers_per_thread": args.get("registers per thread"),
                "shared_memory": args.get("shared memory"),
                "durations_us": [],
            },
        )
        row["durations_us"].append(event.get("dur"))
    for row in kernels.values():
        durations = sorted(d for d in row.pop("durations_us") if d is not None)
        row["launches"] = len(durations)
        row["median_us"] = durations[len(durations) // 2] if durations else None
    return list(kernels.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="2048,4096,8192")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    import torch

    props = torch.cuda.get_device_properties(0)
    report: dict[str, Any] = {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sizes": {},
    }
    for n in (int(x) for x in args.sizes.split(",")):
        report["sizes"][n] = shapes(n, args.iterations)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
