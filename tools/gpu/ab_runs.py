"""Runs of one online row from two trees, side by side: each run's throughputs and online tail,
the GPU's clocks and power while it ran, and each tree's requests pooled over its runs.

One 3 001-request run gives a p99.9 from its 4th-slowest request: two trees that differ there by
a few requests in one run differ by chance as often as not. Pooled over runs (and runs of the two
trees interleaved in one call, so that the host and the GPU's temperature are shared), the
tail is read from tens of requests. An H200 running this row is at its power limit whatever
the tree (nvidia-smi's clock-event reason 0x4, SW power cap): the SM clock in each run's
window is what says whether a tree's tail is the GPU's clock.

    python3 tools/gpu/ab_runs.py --row PREFIX [--smi SMI_CSV_XZ ...] [--json]
        NAME=BENCH_JSON_XZ[,BENCH_JSON_XZ...] NAME=...

The bench JSONs are `tools/gpu/bench-gpu.sh`'s (their qpolicy row keeps each online request's
latency). The nvidia-smi CSVs are `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,
power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active --format=csv -lms 100`
(the columns are found by name; the reasons column may be missing). A run's window is its
trainer's wall_start plus 1 s to plus the run's length less 1 s.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import lzma
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# The bench's own percentiles (nearest rank), so that pooled and per-run numbers read alike.
from qpolicy.doctor.report import latency_stats  # noqa: E402
from tools.gpu.result_json import read_json  # noqa: E402

# nvidia-smi's clock-event reasons (nvml.h: nvmlClocksEventReason*), the bits this row meets.
REASONS = {
    0x1: "idle",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
SLOW_MS = (1.0, 1.5, 2.0)


@dataclass
class Sample:
    """One nvidia-smi line."""

    t: float
    sm_mhz: float
    power_w: float
    reasons: int | None


@dataclass
class Run:
    """One qpolicy run of the row, and native's where the same bench ran it."""

    path: str
    latencies_ms: list[float]
    pods_it_per_s: dict[str, float]
    start: float
    seconds: float
    native_pods_it_per_s: dict[str, float] = field(default_factory=dict)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".xz":
        return io.TextIOWrapper(lzma.open(path), encoding="utf-8")
    return io.TextIOWrapper(path.open("rb"), encoding="utf-8")


def read_smi(path: Path) -> list[Sample]:
    """The samples of an nvidia-smi CSV; lines that are not samples are skipped."""
    samples = []
    with _open_text(path) as f:
        rows = csv.reader(f)
        header = [h.strip() for h in next(rows, [])]

        def col(prefix: str) -> int | None:
            return next((i for i, h in enumerate(header) if h.startswith(prefix)), None)

        t, sm, power = col("timestamp"), col("clocks.current.sm"), col("power.draw")
        reasons = col("clocks_event_reasons.active")
        if t is None or sm is None or power is None:
            raise ValueError(f"{path}: no timestamp, clocks.current.sm or power.draw column")
        for row in rows:
            try:
                when = datetime.strptime(row[t].strip(), "%Y/%m/%d %H:%M:%S.%f")
                samples.append(
                    Sample(
                        when.replace(tzinfo=UTC).timestamp(),
                        float(row[sm].split()[0]),
                        float(row[power].split()[0]),
                        int(row[reasons].strip(), 16) if reasons is not None else None,
                    )
                )
            except (ValueError, IndexError):
                continue
    return samples


def read_runs(path: Path, row: str) -> list[Run]:
    """The qpolicy runs of the one scenario whose name starts with ``row`` in a bench JSON."""
    report = read_json(path)
    runs = []
    matched = [name for name in report.get("scenarios", {}) if name.startswith(row)]
    if len(matched) > 1:
        # bench-gpu.sh's --only is a prefix too: one that matches several rows ran them all.
        raise ValueError(f"{path}: {row!r} starts {len(matched)} rows: {'; '.join(matched)}")
    for name in matched:
        rows = report["scenarios"][name]
        native = next((r for r in rows if r.get("mode") == "native"), None)
        for r in rows:
            if r.get("mode") != "qpolicy":
                continue
            pods = r["pods"]
            trainers = {k: v["it_per_s"] for k, v in pods.items() if "it_per_s" in v}
            start = min(v["wall_start"] for v in pods.values() if "wall_start" in v)
            runs.append(
                Run(
                    path.name,
                    list(pods["online"]["latencies_ms"]),
                    trainers,
                    start,
                    float(pods["online"]["seconds"]),
                    {
                        k: v["it_per_s"]
                        for k, v in (native or {}).get("pods", {}).items()
                        if "it_per_s" in v
                    },
                )
            )
    return runs


def clocks(samples: Sequence[Sample], start: float, seconds: float) -> dict[str, Any]:
    """The SM clock, power and clock-event reasons over a run's window (its first and last
    second left out: the pods start and stop there)."""
    window = [s for s in samples if start + 1 <= s.t <= start + seconds - 1]
    if not window:
        return {}
    out: dict[str, Any] = {
        "samples": len(window),
        "sm_mhz_mean": round(statistics.fmean(s.sm_mhz for s in window)),
        "sm_mhz_min": round(min(s.sm_mhz for s in window)),
        "power_w_mean": round(statistics.fmean(s.power_w for s in window)),
    }
    if all(s.reasons is not None for s in window):
        out["reasons"] = {
            name: round(sum(1 for s in window if (s.reasons or 0) & bit) / len(window), 3)
            for bit, name in REASONS.items()
            if any((s.reasons or 0) & bit for s in window)
        }
    return out


def tail(latencies: Iterable[float]) -> dict[str, Any]:
    """The bench's latency statistics (``latency_stats``: p50 to p99.9 by nearest rank, the
    mean) and the requests over each of SLOW_MS."""
    values = list(latencies)
    out = latency_stats(values)
    for ms in SLOW_MS:
        out[f"over_{ms:g}_ms"] = sum(1 for x in values if x > ms)
    return out


def compare(groups: dict[str, list[Run]], samples: Sequence[Sample]) -> dict[str, Any]:
    """Each group's runs and its pooled tail and mean throughputs."""
    out: dict[str, Any] = {}
    for name, runs in groups.items():
        per_run = []
        for run in runs:
            during = clocks(samples, run.start, run.seconds)
            per_run.append(
                {
                    "run": run.path,
                    "pods_it_per_s": {k: round(v, 2) for k, v in run.pods_it_per_s.items()},
                    **(
                        {"native_it_per_s": run.native_pods_it_per_s}
                        if run.native_pods_it_per_s
                        else {}
                    ),
                    **tail(run.latencies_ms),
                    **({"clocks": during} if during else {}),
                }
            )
        pods = sorted({p for run in runs for p in run.pods_it_per_s})
        out[name] = {
            "runs": per_run,
            "pooled": tail(x for run in runs for x in run.latencies_ms),
            "mean_it_per_s": {
                p: round(statistics.fmean(run.pods_it_per_s[p] for run in runs), 2)
                for p in pods
                if all(p in run.pods_it_per_s for run in runs)
            },
        }
    return out


def table(result: dict[str, Any]) -> list[str]:
    """The comparison as Markdown rows."""
    lines = [
        "| tree | run | pods it/s | p50 / p99 / p99.9 ms | >1 / >1.5 / >2 ms "
        "| SM MHz mean (min), W |",
        "|---|---|---|---|---|---|",
    ]

    def row(tree: str, run: str, pods: dict[str, float], t: dict[str, Any], c: str) -> str:
        its = ", ".join(f"{k} {v:g}" for k, v in pods.items())
        return (
            f"| {tree} | {run} | {its} | {t['p50_ms']:.2f} / {t['p99_ms']:.2f} / "
            f"{t['p999_ms']:.2f} | {t['over_1_ms']} / {t['over_1.5_ms']} / {t['over_2_ms']} | {c} |"
        )

    for tree, g in result.items():
        for r in g["runs"]:
            c = r.get("clocks", {})
            where = f"{c['sm_mhz_mean']} ({c['sm_mhz_min']}), {c['power_w_mean']}" if c else "-"
            lines.append(row(tree, r["run"], r["pods_it_per_s"], r, where))
        lines.append(
            row(tree, f"pooled, {len(g['runs'])} runs", g["mean_it_per_s"], g["pooled"], "-")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="+", metavar="NAME=JSON[,JSON...]")
    parser.add_argument("--row", required=True, help="the scenario's name, or its start")
    parser.add_argument("--smi", action="append", type=Path, default=[], help="nvidia-smi CSV")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    groups: dict[str, list[Run]] = {}
    try:
        for spec in args.groups:
            name, sep, paths = spec.partition("=")
            if not sep or not name or not paths:
                parser.error(f"bad group {spec!r}: NAME=JSON[,JSON...]")
            for path in paths.split(","):
                runs = read_runs(Path(path), args.row)
                if not runs:
                    raise ValueError(f"{path}: no qpolicy run of a row starting {args.row!r}")
                groups.setdefault(name, []).extend(runs)
        samples = [s for path in args.smi for s in read_smi(path)]
    except (OSError, ValueError, KeyError, lzma.LZMAError) as err:
        print(f"ab_runs: {err}", file=sys.stderr)
        return 1
    result = compare(groups, samples)
    print(json.dumps(result, indent=1) if args.json else "\n".join(table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
