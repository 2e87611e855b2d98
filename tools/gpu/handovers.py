"""How often the GPU passed between pods in each daemon CPU run of a ``make bench-gpu`` result,
as the pods' own timelines show it, beside the daemon's CPU over the same window.

    python3 tools/gpu/handovers.py RESULT...    # a bench JSON, .json.xz, or a .tar.xz of them

The daemon's CPU is paid per hand-over (two RM controls each, and the looks around it), and its
own counts of periods and turns cover its whole life, the pods' start and exit included. The
pods' timelines (a time per finished batch) are the GPU's ground truth. Results from before the
bench kept the window's start (``cpu_window_at``) take it as the pods' start plus
``CPU_EDGE_S``, where the bench put it.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.gpu import CPU_EDGE_S, handovers_seen
from tools.gpu.result_json import read_json


def documents(path: Path) -> Iterator[tuple[str, Any]]:
    """(name, parsed JSON) of a result file, or of each JSON member of a tarball."""
    if path.name.endswith(".tar.xz"):
        with tarfile.open(path, "r:xz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                if member.isfile() and member.name.endswith(".json"):
                    raw = tar.extractfile(member)
                    if raw is not None:
                        yield member.name, json.load(io.TextIOWrapper(raw))
        return
    yield path.name, read_json(path)


def rows(name: str, document: Any) -> Iterator[dict[str, Any]]:
    """One row per qpolicy run of a daemon CPU scenario in a bench result."""
    scenarios = document.get("scenarios") if isinstance(document, dict) else None
    if not isinstance(scenarios, dict):
        return
    for scenario, runs in scenarios.items():
        if not scenario.startswith("daemon CPU"):
            continue
        for run in runs:
            daemon, pods = run.get("daemon") or {}, run.get("pods") or {}
            window = daemon.get("cpu_window_s")
            if run.get("mode") != "qpolicy" or not window or not pods:
                continue
            start = daemon.get("cpu_window_at")
            if start is None:
                starts = [p["wall_start"] for p in pods.values() if "wall_start" in p]
                start = min(starts) + CPU_EDGE_S if starts else None
            seen = None if start is None else handovers_seen(pods, start, start + window)
            yield {
                "file": name,
                "scenario": scenario,
                "window_s": window,
                "handovers": seen,
                "per_s": None if seen is None else seen / window,
                "cpu_percent": daemon.get("cpu_percent_of_one_core"),
                "daemon_turns": daemon.get("window_turns"),
            }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    found: list[dict[str, Any]] = []
    for path in args.results:
        try:
            for name, document in documents(path):
                found += rows(name, document)
        except (OSError, ValueError, tarfile.TarError, lzma.LZMAError) as error:
            print(f"handovers: cannot read {path}: {error}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    for row in found:
        seen = "-" if row["handovers"] is None else f"{row['handovers']} ({row['per_s']:.2f}/s)"
        cpu = "-" if row["cpu_percent"] is None else f"{row['cpu_percent']:.2f} %"
        print(f"{row['file']}: {row['scenario']}: {row['window_s']:.0f} s, handed over {seen}, "
              f"daemon CPU {cpu}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
