"""One module parameter of qgpu.ko (or of nvmock, named ``nvmock.NAME``), A against B, in one VM
boot: the online stream's latency next to an offline trainer, the runs alternating between the
two values.

Why in one boot: two boots of the same tree differ by more than many changes do. On 2026-12-05
the CUDA tree's qgpu p99 read 3.54-3.56 ms in one `make bench-vm` boot and 4.11-4.14 ms in the
next, while five alternating pairs in one boot put the two settings' means 0.01 ms apart
(BENCHMARKS.md, thirty-eighth session). A parameter that is writable at run time is set
between runs; the module is loaded once.

Run in the VM of one vCPU that `make bench-vm` uses (the solo is stable only there):

    VM_CPUS=1 tools/vm/run env PARAM=cold_look_us A=0 B=2000 PAIRS=5 TREE=cuda \\
        .venv/bin/python tools/bench/qgpu_vm_ab.py

A parameter of the mock GPU is named with its module, as in ``PARAM=nvmock.engine_fifo A=0 B=1``.
PAIRS pairs of runs of SECONDS each (default 20: 1 001 requests), the first of each pair A;
TREE is "cuda" (CUDA's object tree, tools/gpuload/CUDA_SEQUENCE.md) or "gpuload". A solo of the
same requests runs before and after. Writes build/vm/bench-qgpu-ab.json: every run's p50, p90,
p99, the USERD reads a pass and the scheduler thread's CPU, and each value's mean.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from qpolicy.enforcers.kmod.client import QgpuClient  # noqa: E402
from qpolicy.enforcers.kmod.sysfs import PARAMS_ROOT  # noqa: E402
from tests.vm.gpuload import start_together  # noqa: E402
from tests.vm.nvmock import NVMOCK_PARAMS, reset, threads_named  # noqa: E402
from tests.vm.qgpu_env import cgroups, in_cgroup, sched_counts  # noqa: E402
from tools.bench.qgpu_vm import (  # noqa: E402
    PERIOD_US,
    QGPU,
    REQUEST,
    SATURATE,
    TREES,
    load_nvmock,
)

PARAM = os.environ.get("PARAM", "cold_look_us")
VALUES = (os.environ.get("A", "0"), os.environ.get("B", "2000"))
PAIRS = int(os.environ.get("PAIRS", "5"))
SECONDS = int(os.environ.get("SECONDS", "20"))
TREE = TREES["CUDA tree" if os.environ.get("TREE", "cuda") == "cuda" else "gpuload tree"]
OUT = ROOT / "build" / "vm" / "bench-qgpu-ab.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sched_ticks() -> int:
    """CPU ticks of qgpu's scheduler threads (named qgpu/gpuN) so far."""
    ticks = 0
    for pid in threads_named("qgpu/gpu"):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def quantiles(report: dict[str, Any]) -> dict[str, float]:
    """gpuload's own p50 and p99 (as `make bench-vm` reports them) and a p90 from its requests."""
    ms = sorted(report["latencies_ms"])
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    return {"p50_ms": report["p50_ms"], "p90_ms": p90, "p99_ms": report["p99_ms"]}


def param_path(name: str) -> Path:
    """Where the parameter ``name`` is written: qgpu's, or nvmock's for ``nvmock.NAME``."""
    module, _, param = name.rpartition(".")
    if module == "nvmock":
        return NVMOCK_PARAMS / param
    if module in ("", "qgpu"):
        return PARAMS_ROOT / param
    raise SystemExit(f"PARAM {name!r}: not a parameter of qgpu or nvmock")


def run(client: QgpuClient, value: str) -> dict[str, Any]:
    param_path(PARAM).write_text(value)
    request = [*TREE, *REQUEST, "--seconds", str(SECONDS)]
    with cgroups(2) as (online, offline):
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        reset()
        passes, reads = sched_counts()
        ticks = sched_ticks()
        started = time.monotonic()
        infer, train = start_together(
            request,
            [*TREE, *SATURATE, "--seconds", str(SECONDS)],
            cgroups=[str(online.path), str(offline.path)],
        )
        served = infer.result()
        train.result()
        wall = time.monotonic() - started
        passes_after, reads_after = sched_counts()
        out = {
            PARAM: value,
            "requests": served["requests"],
            **quantiles(served),
            "reads_a_pass": (reads_after - reads) / max(1, passes_after - passes),
            "sched_cpu_pct": (sched_ticks() - ticks) / CLK_TCK / wall * 100,
        }
        client.del_cgroup(online.id)
        client.del_cgroup(offline.id)
        client.set_gpu(0, "best-effort")
    return out


def solo() -> dict[str, float]:
    with cgroups(1) as (online,):
        load = in_cgroup(online, [*TREE, *REQUEST, "--seconds", str(SECONDS)])
        return quantiles(load.ready().result())


def main() -> int:
    load_nvmock()
    subprocess.run(["insmod", str(QGPU), "target=nvmock"], check=True)
    result: dict[str, Any] = {
        "param": PARAM,
        "values": VALUES,
        "tree": TREE,
        "vcpus": os.cpu_count(),
    }
    with QgpuClient.open() as client:
        result["solo_before"] = solo()
        runs = []
        for pair in range(PAIRS):
            for value in VALUES:
                runs.append(run(client, value))
                r = runs[-1]
                print(
                    f"pair {pair + 1} {PARAM}={value}: p50/p90/p99 {r['p50_ms']:.2f}/"
                    f"{r['p90_ms']:.2f}/{r['p99_ms']:.2f} ms, {r['reads_a_pass']:.2f} reads a"
                    f" pass, scheduler {r['sched_cpu_pct']:.1f} % CPU",
                    flush=True,
                )
        result["solo_after"] = solo()
    subprocess.run(["rmmod", "qgpu"], check=True)
    subprocess.run(["rmmod", "nvmock"], check=True)
    result["runs"] = runs
    result["means"] = {
        value: {
            key: statistics.mean(r[key] for r in runs if r[PARAM] == value)
            for key in ("p50_ms", "p90_ms", "p99_ms", "reads_a_pass", "sched_cpu_pct")
        }
        for value in VALUES
    }
    for value, mean in result["means"].items():
        print(
            f"{PARAM}={value}, mean of {PAIRS}: p50/p90/p99 {mean['p50_ms']:.2f}/"
            f"{mean['p90_ms']:.2f}/{mean['p99_ms']:.2f} ms, {mean['reads_a_pass']:.2f} reads a"
            f" pass, scheduler {mean['sched_cpu_pct']:.1f} % CPU"
        )
    b, a = result["solo_before"], result["solo_after"]
    print(
        f"solo p50/p99: before {b['p50_ms']:.2f}/{b['p99_ms']:.2f},"
        f" after {a['p50_ms']:.2f}/{a['p99_ms']:.2f} ms"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
