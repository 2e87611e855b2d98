"""Whether an online row's slow requests fall where the hypervisor took CPU from the GPU host.

The GPU hosts are virtual machines. tools/gpu/host_noise.py samples the host's /proc/stat beside
a run, steal time included: time the hypervisor ran something else while this guest's CPUs
wanted to run. An online request is slow when it waits for a CPU of the host (the stream's own
thread, or the daemon's that closes the trainer's channels), so a tail that comes from the host
shows as slow requests gathered in the samples with steal. This splits each mode's requests of a
`tools/bench/gpu.py` online row by whether their arrival fell in a sample with steal, and gives
the share of slow ones (over --slow-x times the mode's own p50) on either side.

    python3 tools/gpu/steal_tails.py [--slow-x 1.5] [--json] BENCH_JSON[.xz] [NOISE_JSON[.xz]]

Without NOISE_JSON each mode is split by the steal samples its own run kept (`make bench-gpu`
samples steal itself since 549e7f1: the mode's `host_steal`, each sample's end and its ticks).

Request i of a mode arrives at its trainer's wall_start plus i / ONLINE_HZ: both pods wait for
the same start time after CUDA's set-up (tools/gpu/matmul.py), and the stream is open loop.
Steal is counted in ticks of the host's clock (10 ms across all its CPUs): a sample without any
may still have had less than a tick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.gpu.result_json import Unreadable, read_object

ONLINE_HZ = 150.0


class BadInput(ValueError):
    """A file that is not what this reads."""


@dataclass(frozen=True)
class Split:
    """One mode of one row: its requests in samples with steal and in those without."""

    scenario: str
    mode: str
    slow_above_ms: float
    with_steal: int
    slow_with_steal: int
    without_steal: int
    slow_without_steal: int

    @property
    def rate_with(self) -> float | None:
        return self.slow_with_steal / self.with_steal if self.with_steal else None

    @property
    def rate_without(self) -> float | None:
        return self.slow_without_steal / self.without_steal if self.without_steal else None


def steal_windows(noise: dict[str, Any]) -> list[tuple[float, float, bool]]:
    """Each sample as (from, to, steal seen), in wall-clock seconds."""
    start, interval, samples = noise.get("start"), noise.get("interval_s"), noise.get("samples")
    if not isinstance(start, int | float) or not isinstance(interval, int | float):
        raise BadInput("noise: no start or interval_s")
    if not isinstance(samples, list) or not samples:
        raise BadInput("noise: no samples")
    out = []
    for s in samples:
        if not isinstance(s, dict) or not isinstance(s.get("t"), int | float):
            raise BadInput(f"noise: a sample without a time: {s!r}"[:120])
        # t is when the sample was taken, counted from start; it covers the interval before.
        end = start + s["t"]
        out.append((end - interval, end, float(s.get("steal") or 0) > 0))
    return out


def run_windows(scenario: str, mode: dict[str, Any]) -> list[tuple[float, float, bool]]:
    """The steal samples a bench run kept of itself, as steal_windows() gives a sampler's."""
    steal = mode.get("host_steal")
    where = f"{scenario}, {mode.get('mode')}"
    if not isinstance(steal, dict) or not isinstance(steal.get("interval_s"), int | float):
        raise BadInput(f"{where}: no steal samples of its own (a bench from before 549e7f1?)")
    interval, raw = steal["interval_s"], steal.get("raw")
    if not isinstance(raw, list) or not raw:
        raise BadInput(f"{where}: no steal samples of its own")
    out = []
    for sample in raw:
        if not (isinstance(sample, list) and len(sample) == 2
                and all(isinstance(x, int | float) for x in sample)):  # fmt: skip
            raise BadInput(f"{where}: a steal sample that is not [end, ticks]: {sample!r}"[:120])
        end, ticks = sample
        out.append((end - interval, end, ticks > 0))
    return sorted(out)


def split(
    scenario: str, mode: dict[str, Any], windows: list[tuple[float, float, bool]], slow_x: float
) -> Split:
    pods = mode.get("pods") or {}
    latencies = (pods.get("online") or {}).get("latencies_ms")
    wall_start = (pods.get("trainer") or {}).get("wall_start")
    if not latencies or not isinstance(wall_start, int | float):
        raise BadInput(f"{scenario}, {mode.get('mode')}: no online latencies or trainer start")
    threshold = slow_x * statistics.median(latencies)
    counts = [0, 0, 0, 0]  # with, slow with, without, slow without
    k = 0
    for i, latency in enumerate(latencies):
        at = wall_start + i / ONLINE_HZ
        while k < len(windows) and windows[k][1] < at:
            k += 1
        if k == len(windows) or at < windows[k][0]:
            continue  # outside the sampled time
        side = 0 if windows[k][2] else 2
        counts[side] += 1
        counts[side + 1] += latency > threshold
    return Split(scenario, str(mode.get("mode")), threshold, *counts)


def splits(bench: dict[str, Any], noise: dict[str, Any] | None, slow_x: float) -> list[Split]:
    """Each online mode's split; by ``noise``'s samples, or, where it is None, by its own run's."""
    windows = sorted(steal_windows(noise)) if noise is not None else None
    scenarios = bench.get("scenarios")
    if not isinstance(scenarios, dict) or not scenarios:
        raise BadInput("bench: no scenarios")
    out = []
    for name, modes in scenarios.items():
        for mode in modes:
            if "online" in (mode.get("pods") or {}):
                own = windows if windows is not None else run_windows(name, mode)
                out.append(split(name, mode, own, slow_x))
    if not out:
        raise BadInput("bench: no online row")
    return out


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.2f} %"


def table(rows: list[Split]) -> str:
    lines = [
        "| row | mode | slow above | slow, samples with steal | slow, samples without |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.mode} | {r.slow_above_ms:.2f} ms "
            f"| {r.slow_with_steal} / {r.with_steal} ({_pct(r.rate_with)}) "
            f"| {r.slow_without_steal} / {r.without_steal} ({_pct(r.rate_without)}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="tools/bench/gpu.py's JSON of an online row")
    parser.add_argument(
        "noise",
        type=Path,
        nargs="?",
        help="tools/gpu/host_noise.py's JSON beside it; without it, each run's own samples",
    )
    parser.add_argument("--slow-x", type=float, default=1.5, help="slow: over this x its p50")
    parser.add_argument("--json", action="store_true", help="one JSON object a mode")
    args = parser.parse_args(argv)
    if not args.slow_x > 0:
        print(f"steal_tails: --slow-x must be positive, not {args.slow_x}", file=sys.stderr)
        return 2
    try:
        noise = read_object(args.noise) if args.noise is not None else None
        rows = splits(read_object(args.bench), noise, args.slow_x)
    except (BadInput, Unreadable) as err:
        print(f"steal_tails: {err}", file=sys.stderr)
        return 1
    if args.json:
        for r in rows:
            print(json.dumps({**asdict(r), "rate_with": r.rate_with,
                              "rate_without": r.rate_without}))  # fmt: skip
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
