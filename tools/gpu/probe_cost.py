"""The eBPF probe's cost per RM ioctl on a real NVIDIA driver.

Run as root on a GPU machine with bcc importable and qpolicy on PYTHONPATH
(``tools/gpu/bcc-env.sh`` sets that up on the lent GPU machine):

    python3 tools/gpu/probe_cost.py --bench tools/bench/ioctlbench/ioctlbench --out cost.json

``tools/bench/ioctlbench`` times RM_CONTROL, RM_ALLOC + RM_FREE and SYS_PARAMS on
/dev/nvidiactl (ns per call). It runs without the probe and with it loaded, alternating, the
first and last runs without: what the probe adds to each call is the difference of the medians.
While the probe is loaded a thread drains its events every 10 ms, as the daemon's loop does, so
the probe pays for events delivered, not dropped; their number is reported as a witness that it
saw the calls. `make bench-vm` measures the same calls under qgpu.ko in the VM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
from pathlib import Path
from typing import Any

from qpolicy.telemetry.probe import NvProbe
from tools.gpu.hostinfo import host_facts

KEYS = ("control_ns", "alloc_free_ns", "client_alloc_free_ns", "sysparams_ns")


# The CPU ioctlbench is pinned to (--cpu): RM calls vary by 2x from run to run when the process
# moves between CPUs (call BC, H100: 3.5-6.1 us per control unpinned).
CPU: list[str] = []


def bench(path: str, iterations: int) -> dict[str, Any]:
    argv = [*(["taskset", "-c", CPU[0]] if CPU else []), path, str(iterations)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:], "partial": done.stdout.strip()}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def with_probe(path: str, iterations: int) -> tuple[dict[str, Any], int, int]:
    """One run with the probe loaded: its result, the events drained and the events lost."""
    seen = 0
    stop = threading.Event()
    with NvProbe() as probe:

        def drain() -> None:
            nonlocal seen
            while not stop.wait(0.01):
                seen += len(probe.poll(0))

        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
        try:
            result = bench(path, iterations)
        finally:
            stop.set()
            thread.join()
            seen += len(probe.poll(0))
            lost = probe.lost
    return result, seen, lost


def summarise(without: list[dict[str, Any]], loaded: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in KEYS:
        # A run that failed, or a call RM refused (ioctlbench's null), measured nothing.
        a = [r[key] for r in without if r.get(key) is not None]
        b = [r[key] for r in loaded if r.get(key) is not None]
        if a and b:
            base, probed = statistics.median(a), statistics.median(b)
            out[key] = {
                "median_without": base,
                "median_with": probed,
                "added_ns": probed - base,
                "ratio": probed / base,
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="the built tools/bench/ioctlbench")
    parser.add_argument("--out", required=True)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=None, help="pin ioctlbench to this CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        CPU.append(str(args.cpu))
    if args.iterations < 1 or args.repeats < 1:
        parser.error(f"--iterations {args.iterations} / --repeats {args.repeats}: must be >= 1")
    result: dict[str, Any] = host_facts()
    without: list[dict[str, Any]] = [bench(args.bench, args.iterations)]
    loaded: list[dict[str, Any]] = []
    events: list[int] = []
    lost: list[int] = []
    for _ in range(args.repeats):
        run, seen, dropped = with_probe(args.bench, args.iterations)
        loaded.append(run)
        events.append(seen)
        lost.append(dropped)
        without.append(bench(args.bench, args.iterations))
    result.update(
        iterations=args.iterations,
        cpu=args.cpu,
        without=without,
        with_probe=loaded,
        events_seen=events,
        # Events the probe's buffer had no room for: a witness of what it streamed, with seen.
        events_lost=lost,
        summary=summarise(without, loaded),
    )
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
