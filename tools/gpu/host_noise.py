"""What else runs on a GPU host while a measurement does: a sampler of the host's CPU.

    python3 tools/gpu/host_noise.py --seconds 120 --interval 0.25 --out noise.json [--exclude PID]

Every interval it reads /proc/stat (the whole host's busy, iowait, softirq and steal time) and each
process's utime + stime from /proc/PID/stat, and records the processes that used more than
--floor of one core in that interval (name, pid, share). Why: the online bench's solo stream
was unstable (p99 > 2x p50) as the first online run on a freshly started H200 in two calls
(35C, 35G), with its slow requests spread over seconds; this says whether the host was busy
with something else meanwhile. Steal is the time the hypervisor ran something else while this
guest's CPUs wanted to run (the GPU hosts are virtual machines): a stall no process here shows.
It reads only /proc: nothing here touches the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def host_times() -> dict[str, int]:
    """The aggregate line of /proc/stat, in ticks."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {name: int(value) for name, value in zip(names, fields, strict=False)}


def process_times() -> dict[int, tuple[str, int]]:
    """Each process's name and utime + stime, in ticks; one that ends while read is left out."""
    out: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The name is in parentheses and may hold spaces; the fields after it are fixed.
        name = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))
    return out


class StealWatch:
    """The host's steal time while a run lasts, from /proc/stat every ``interval`` s on a thread
    of its own: each sample's end (wall clock) and the ticks stolen in it. `tools/bench/gpu.py`
    keeps it with every run, so that a row's tail can be set beside what the hypervisor took
    (tools/gpu/steal_tails.py did it from this script's samples, BENCHMARKS.md, 2026-12-05)."""

    def __init__(self, interval: float = 0.25, read: Callable[[], int] | None = None) -> None:
        self.interval = interval
        self.read = read or (lambda: host_times().get("steal", 0))
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-watch", daemon=True)

    def _run(self) -> None:
        last = self.read()
        while not self._stop.wait(self.interval):
            now = self.read()
            self.samples.append((time.time(), now - last))
            last = now

    def __enter__(self) -> StealWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def within(self, start: float, end: float) -> dict[str, Any]:
        """The samples that ended in [start, end]: how many, how many with steal, the seconds of
        CPU stolen in them (over all the host's CPUs), and each (end, ticks)."""
        inside = [(t, ticks) for t, ticks in self.samples if start <= t <= end]
        return {
            "interval_s": self.interval,
            "samples": len(inside),
            "with_steal": sum(1 for _, ticks in inside if ticks > 0),
            "steal_cpu_s": sum(ticks for _, ticks in inside) / TICK,
            "raw": [[round(t, 3), ticks] for t, ticks in inside],
        }


def sample(seconds: float, interval: float, floor: float, exclude: set[int]) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    stop: list[bool] = []
    # Stopped early by SIGTERM (the caller's measurement is over): what was sampled is kept.
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    start = time.time()
    last_host, last_procs, last_t = host_times(), process_times(), time.monotonic()
    while time.time() - start < seconds and not stop:
        time.sleep(interval)
        host, procs, now = host_times(), process_times(), time.monotonic()
        span = now - last_t
        delta = {k: host[k] - last_host.get(k, 0) for k in host}
        total = sum(delta.values()) or 1
        busy = [
            {
                "pid": pid,
                "name": name,
                "cores": round((ticks - last_procs[pid][1]) / TICK / span, 3),
            }
            for pid, (name, ticks) in procs.items()
            if pid in last_procs and pid not in exclude and pid != os.getpid()
            if (ticks - last_procs[pid][1]) / TICK / span >= floor
        ]
        samples.append(
            {
                "t": round(time.time() - start, 3),
                "busy": round(1 - (delta.get("idle", 0) + delta.get("iowait", 0)) / total, 4),
                "iowait": round(delta.get("iowait", 0) / total, 4),
                "softirq": round(delta.get("softirq", 0) / total, 4),
                "steal": round(delta.get("steal", 0) / total, 4),
                "processes": sorted(busy, key=lambda p: -p["cores"]),
            }
        )
        last_host, last_procs, last_t = host, procs, now
    return {
        "start": start,
        "interval_s": interval,
        "floor_cores": floor,
        "cpus": os.cpu_count(),
        "samples": samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--floor", type=float, default=0.02, help="least share of a core listed")
    parser.add_argument("--exclude", type=int, action="append", default=[], metavar="PID")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.seconds <= 0 or args.interval <= 0:
        parser.error(f"--seconds and --interval must be positive: {args.seconds}, {args.interval}")
    result = sample(args.seconds, args.interval, args.floor, set(args.exclude))
    Path(args.out).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
