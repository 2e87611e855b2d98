"""GPU tier of the telemetry issue: the eBPF probe on a real NVIDIA driver, checked independently.

Run as root on a machine with a GPU, bcc importable and qpolicy on PYTHONPATH
(``tools/gpu/run-probe-check.sh`` sets that up on the lent GPU machine):

    python3 tools/gpu/probe_check.py --out results.json

1. A PyTorch process runs in a cgroup of its own with the probe loaded. Two independent witnesses
   watch the same process: an LD_PRELOAD logger (tools/gpu/ioctl_logger.c, its own fd table and
   decoding) counts its ioctls by escape and records each RM_ALLOC's class and status, and PyTorch's
   profiler (CUPTI) counts the kernels that ran. While the process still holds its GPU objects the
   probe's per-escape counts, the tracker's TSGs and channels, and the launch count are compared
   with theirs.
2. The same workload's throughput with and without the probe loaded, interleaved, at two matrix
   sizes: the probe's overhead on the workload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Kind
from qpolicy.telemetry.cgroups import CgroupMap, cgroup2_mount
from qpolicy.telemetry.live import LiveView
from qpolicy.telemetry.probe import NvProbe
from tools.gpu.hostinfo import host_facts

HERE = Path(__file__).resolve().parent
CHANNEL_CLASSES = {cls for cls, (_, kind) in abi.CLASSES.items() if kind is Kind.CHANNEL}


def build_logger(out_dir: Path) -> Path:
    library = out_dir / "ioctl_logger.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
            str(library),
            str(HERE / "ioctl_logger.c"),
            "-ldl",
        ],
        check=True,
    )
    return library


def make_cgroup(name: str) -> Path:
    path = cgroup2_mount() / name
    path.mkdir(exist_ok=True)
    return path


def spawn_in_cgroup(cgroup: Path, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    # The child joins the cgroup before exec, so every syscall of the workload is attributed to it.
    wrapper = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *argv]
    return subprocess.Popen(
        wrapper, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def logger_escapes(log: dict[str, Any]) -> Counter[str]:
    names: Counter[str] = Counter()
    for key, count in log["escapes"].items():
        _, nr = key.split(":")
        try:
            names[Escape(int(nr)).name] += count
        except ValueError:
            names[f"escape 0x{int(nr):02x}"] += count
    for number, count in log["uvm"].items():
        names[abi.UVM_IOCTLS.get(int(number), f"uvm 0x{int(number):x}")] += count
    return names


def count_check(probe: NvProbe, logger: Path, out_dir: Path) -> dict[str, Any]:
    cgroup = make_cgroup("qpolicy-gpucheck")
    cgroups = CgroupMap()
    cgid = cgroups.id_of("/" + cgroup.name)
    view = LiveView(probe, cgroups)
    log_path = out_dir / "ioctl_logger.json"
    env = {**os.environ, "LD_PRELOAD": str(logger), "IOCTL_LOGGER_OUT": str(log_path)}
    argv = [
        sys.executable,
        str(HERE / "matmul.py"),
        "--n",
        "4096",
        "--iters",
        "2000",
        "--count-kernels",
        "--hold",
        "--label",
        "count-check",
    ]
    proc = spawn_in_cgroup(cgroup, argv, env)
    assert proc.stdout is not None and proc.stdin is not None
    line = ""
    while not line:
        view.feed(probe.poll(100))
        line = proc.stdout.readline() if proc.poll() is None else ""
        if proc.poll() is not None and not line:
            raise RuntimeError(f"workload exited with {proc.returncode}")
    workload = json.loads(line)
    time.sleep(0.5)
    view.feed(probe.poll(200))
    pid = workload["pid"]
    summary = view.tracker.summary(pid) if pid in view.tracker.processes else None
    groups = view.tracker.channel_groups(pid)
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
    view.feed(probe.poll(500))
    counters = probe.counters().get(cgid)
    log = json.loads(log_path.read_text())
    witness = logger_escapes(log)
    seen = Counter(dict(counters.escapes)) if counters else Counter()
    mismatches = {
        name: {"probe": seen.get(name, 0), "logger": witness.get(name, 0)}
        for name in sorted(set(seen) | set(witness))
        if seen.get(name, 0) != witness.get(name, 0)
    }
    ok_allocs = [(cls, status) for cls, status, ret in log["allocs"] if ret == 0 and status == 0]
    logger_tsgs = sum(1 for cls, _ in ok_allocs if cls == 0xA06C)
    logger_channels = sum(1 for cls, _ in ok_allocs if cls in CHANNEL_CLASSES)
    launches = counters.launches if counters else 0
    kernels = workload.get("kernels_profiled", 0)
    cgroup.rmdir()
    return {
        "workload": workload,
        "probe_features": dict(probe.features),
        "probe_lost_events": probe.lost,
        "escapes_probe": dict(sorted(seen.items())),
        "escapes_logger": dict(sorted(witness.items())),
        "escape_mismatches": mismatches,
        "uvm_other_logger": log["uvm_other"],
        "tracker": None
        if summary is None
        else {
            "tsgs": summary.tsgs,
            "channels": summary.channels,
            "engines": summary.engines,
            "device_bytes": summary.device_bytes,
            "clients": summary.clients,
            "channel_groups": [
                {
                    "client": hex(g.client),
                    "fd": g.fd,
                    "subdevice": g.subdevice and hex(g.subdevice),
                    "channels": len(g.channels),
                    "tsgs": len(g.tsgs),
                }
                for g in groups
            ],
        },
        "logger_tsgs": logger_tsgs,
        "logger_channels": logger_channels,
        "launches_probe": launches,
        "kernels_profiler": kernels,
        "launch_error": None if not kernels else (launches - kernels) / kernels,
    }


def throughput(n: int, seconds: float) -> float:
    out = subprocess.run(
        [sys.executable, str(HERE / "matmul.py"), "--n", str(n), "--seconds", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["it_per_s"])


def overhead(sizes: list[int], seconds: float, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for n in sizes:
        without: list[float] = []
        with_probe: list[float] = []
        for _ in range(repeats):
            without.append(throughput(n, seconds))
            with NvProbe() as probe:
                with_probe.append(throughput(n, seconds))
                probe.poll(0)
        a, b = statistics.median(without), statistics.median(with_probe)
        results[str(n)] = {
            "it_per_s_without": without,
            "it_per_s_with": with_probe,
            "median_without": a,
            "median_with": b,
            "overhead": (a - b) / a,
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = host_facts()
    logger = build_logger(out.parent)
    with NvProbe() as probe:
        result["count_check"] = count_check(probe, logger, out.parent)
    out.write_text(json.dumps(result, indent=2))
    result["overhead"] = overhead([2048, 4096], args.seconds, args.repeats)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
