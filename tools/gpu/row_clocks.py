"""The GPU's clocks in each mode's run of a `tools/bench/gpu.py` result: was a mode's tail, or its
trainer's rate, the clock's?

    python3 tools/gpu/row_clocks.py [--json] BENCH_JSON[.xz] SMI_CSV[.xz] [SMI_CSV ...]

The nvidia-smi CSVs are those `tools/gpu/ab_runs.py` reads (timestamp, clocks.sm, power.draw and,
where the driver has them, the clock-event reasons), sampled beside the bench, and each run is
summed by ab_runs's clocks(): from its pods' earliest start plus 1 s to that start plus its
longest pod's run less 1 s (ab_runs takes the online stream's length, which a bench's pods share
to within milliseconds; a row without an online pod has none). ab_runs reads only
the qpolicy runs of one row against another tree's; this reads every mode of every row, so that
native and MPS can be set beside qpolicy (an H100 at its power limit read 1 462-1 489 MHz in all
three modes of the 8192 row, BENCHMARKS.md, forty-first session).
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.gpu.ab_runs import Sample, clocks, read_smi
from tools.gpu.result_json import read_object


def run_window(run: dict[str, Any]) -> tuple[float, float] | None:
    """A mode's run as (start, seconds): its pods' earliest start and longest run; None where its
    pods kept no start (a run that failed)."""
    pods = [p for p in (run.get("pods") or {}).values() if isinstance(p, dict)]
    starts = [p["wall_start"] for p in pods if isinstance(p.get("wall_start"), int | float)]
    lengths = [p["seconds"] for p in pods if isinstance(p.get("seconds"), int | float)]
    if not starts or not lengths:
        return None
    return min(starts), max(lengths)


def row_clocks(report: dict[str, Any], samples: list[Sample]) -> list[dict[str, Any]]:
    """Each scenario's modes in order, with the clocks over their windows ({} where no sample fell
    in one)."""
    scenarios = report.get("scenarios")
    if not isinstance(scenarios, dict) or not scenarios:
        raise ValueError("bench: no scenarios")
    out = []
    for name, runs in scenarios.items():
        for run in runs:
            window = run_window(run)
            during = clocks(samples, *window) if window else {}
            out.append({"scenario": name, "mode": run.get("mode"), "clocks": during})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| row | mode | SM MHz mean (min) | W mean | samples | clock-event reasons |"]
    lines.append("|---|---|---|---|---|---|")
    for r in rows:
        c = r["clocks"]
        if not c:
            lines.append(f"| {r['scenario']} | {r['mode']} | - | - | 0 | - |")
            continue
        reasons = ", ".join(f"{k} {v:.0%}" for k, v in c.get("reasons", {}).items()) or "-"
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {c['sm_mhz_mean']} ({c['sm_mhz_min']}) "
            f"| {c['power_w_mean']} | {c['samples']} | {reasons} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="tools/bench/gpu.py's JSON")
    parser.add_argument("smi", type=Path, nargs="+", help="nvidia-smi's CSV beside it")
    parser.add_argument("--json", action="store_true", help="one JSON object a mode")
    args = parser.parse_args(argv)
    try:
        samples = [s for path in args.smi for s in read_smi(path)]
        rows = row_clocks(read_object(args.bench), samples)
    except (OSError, ValueError, lzma.LZMAError) as err:
        print(f"row_clocks: {err}", file=sys.stderr)
        return 1
    print("\n".join(json.dumps(r) for r in rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
