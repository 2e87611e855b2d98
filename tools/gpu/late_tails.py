"""How much of an online stream's tail is its host issuing requests late, not the GPU holding them.

An online request's latency runs from its arrival (the stream is open loop at a fixed rate) to
the end of its synchronize. Since 2bbd6de tools/gpu/matmul.py also keeps how late it issued each
request (late_ms): time.sleep's oversleep, a vCPU its hypervisor woke late, or a backlog behind
the request before. Latency less lateness is the time from issue to done: the launch, any wait
for the engine, the run and the synchronize's return, the part a GPU scheduler acts on.

A request is slow when its latency is over --slow-x times the run's p50; a slow one was issued
late when its lateness is at least half its excess over the p50: the host, more than the GPU,
made it slow. Why: the online bench's solos on H100 hosts were unstable (p99 over 2x p50) in
every run of calls 41B and 42B, also with no steal, where the same stream on a fresh H100 of
call 42C was stable in 8 of 10 runs, and slow requests there were mostly issued late.

    python3 tools/gpu/late_tails.py [--slow-x 1.5] [--json] FILE[.xz]...

FILE: a tools/bench/gpu.py JSON (its solos before and after the rows, and each mode's online
stream) or the JSON line matmul.py printed for one stream. Percentiles are nearest rank, as the
bench's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.doctor.report import percentile
from tools.gpu.result_json import Unreadable, read_object

# Slow: over this many times the stream's own p50 (as steal_tails.py's default).
SLOW_X = 1.5

# The bench's keys of its solo streams, and how they are named here.
SOLOS = (("online_solo", "solo before"), ("online_solo_after", "solo after"))


class BadInput(ValueError):
    """A file that is not what this reads."""


@dataclass(frozen=True)
class Tail:
    """One online stream: its latency, its issue-to-done time and its lateness, and its slow
    requests with how many of them were issued late."""

    source: str
    run: str
    requests: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    issued_p50_ms: float
    issued_p99_ms: float
    issued_p999_ms: float
    late_p50_ms: float
    late_p99_ms: float
    slow: int
    slow_issued_late: int


def _pcts(values: list[float]) -> tuple[float, float, float]:
    out = [percentile(values, q) for q in (0.50, 0.99, 0.999)]
    return out[0] or 0.0, out[1] or 0.0, out[2] or 0.0


def tail(source: str, run: str, stream: dict[str, Any], slow_x: float) -> Tail:
    """The split of one stream (matmul.py's output: latencies_ms and late_ms)."""
    latencies, late = stream.get("latencies_ms"), stream.get("late_ms")
    if not isinstance(latencies, list) or not latencies:
        raise BadInput(f"{source}, {run}: no latencies_ms")
    if not isinstance(late, list):
        raise BadInput(f"{source}, {run}: no late_ms (a stream from before 2bbd6de?)")
    if len(late) != len(latencies):
        raise BadInput(f"{source}, {run}: {len(late)} late_ms for {len(latencies)} latencies")
    if not all(isinstance(x, int | float) for x in latencies + late):
        raise BadInput(f"{source}, {run}: a latency or lateness that is not a number")
    issued = [total - wait for total, wait in zip(latencies, late, strict=True)]
    p50, p99, p999 = _pcts(latencies)
    slow = [i for i, x in enumerate(latencies) if x > slow_x * p50]
    issued_late = [i for i in slow if late[i] >= (latencies[i] - p50) / 2]
    late_p50, late_p99, _ = _pcts(late)
    return Tail(
        source, run, len(latencies), p50, p99, p999, *_pcts(issued),
        late_p50, late_p99, len(slow), len(issued_late),
    )  # fmt: skip


def streams(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(run, stream) of each online stream in a bench JSON, or the one stream matmul.py printed."""
    if "latencies_ms" in data:
        return [(str(data.get("label") or "stream"), data)]
    out = [(name, data[key]) for key, name in SOLOS if isinstance(data.get(key), dict)]
    scenarios = data.get("scenarios")
    if isinstance(scenarios, dict):
        for scenario, modes in scenarios.items():
            for mode in modes if isinstance(modes, list) else []:
                online = (mode.get("pods") or {}).get("online") if isinstance(mode, dict) else None
                if isinstance(online, dict):
                    out.append((f"{scenario}, {mode.get('mode')}", online))
    if not out:
        raise BadInput("no online stream (neither a bench's online row nor matmul.py's stream)")
    return out


def tails(path: Path, slow_x: float, label: str | None = None) -> list[Tail]:
    try:
        runs = streams(read_object(path))
    except BadInput as err:
        raise BadInput(f"{path}: {err}") from err
    return [tail(label or path.name, run, stream, slow_x) for run, stream in runs]


def labels(paths: list[Path]) -> list[str]:
    """Each file's name, with as many of its folders as tell it from the others given: the
    device's tars hold one bench.json per row (rows-43B/8192/bench.json), which their names
    alone would not tell apart."""
    distinct = len(set(paths))
    depth = 1
    while depth < max(len(p.parts) for p in paths):
        if len({Path(*p.parts[-depth:]) for p in paths}) == distinct:
            break
        depth += 1
    return [str(Path(*p.parts[-depth:])) for p in paths]


def table(rows: list[Tail]) -> str:
    lines = [
        "| file | run | requests | p50 / p99 / p99.9 | issue to done p50 / p99 / p99.9 "
        "| late p50 / p99 | slow | of them issued late |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.source} | {r.run} | {r.requests} "
            f"| {r.p50_ms:.3f} / {r.p99_ms:.3f} / {r.p999_ms:.3f} "
            f"| {r.issued_p50_ms:.3f} / {r.issued_p99_ms:.3f} / {r.issued_p999_ms:.3f} "
            f"| {r.late_p50_ms:.3f} / {r.late_p99_ms:.3f} | {r.slow} | {r.slow_issued_late} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE")
    parser.add_argument("--slow-x", type=float, default=SLOW_X, help="slow: over this x its p50")
    parser.add_argument("--json", action="store_true", help="one JSON object a stream")
    args = parser.parse_args(argv)
    if not args.slow_x > 0:
        print(f"late_tails: --slow-x must be positive, not {args.slow_x}", file=sys.stderr)
        return 2
    try:
        rows = [
            row
            for path, label in zip(args.files, labels(args.files), strict=True)
            for row in tails(path, args.slow_x, label)
        ]
    except (BadInput, Unreadable) as err:
        print(f"late_tails: {err}", file=sys.stderr)
        return 1
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
