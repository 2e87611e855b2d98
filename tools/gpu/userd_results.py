"""What the tools over tools/gpu/userd_fetch.py's kept raw results share: where they are, the
GPU a file's name says, and one command line (files, or every kept result; --json)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.gpu.result_json import Unreadable

RESULTS = Path(__file__).resolve().parent / "results"
Run = TypeVar("Run")


class BadResult(ValueError):
    """A file that is not a userd_fetch.py result this can read."""


def gpu_of(name: str) -> str:
    """The GPU model a result's file name says (h100, h200), upper-cased; '?' if none."""
    for part in name.split("-"):
        if part in ("h100", "h200"):
            return part.upper()
    return "?"


def name_of(path: Path) -> str:
    """A result's name: its file's, without .json or .json.xz."""
    return path.name.removesuffix(".xz").removesuffix(".json")


def main_over_results(
    argv: list[str] | None,
    doc: str,
    tool: str,
    load: Callable[[Path], Run],
    as_json: Callable[[Run], str],
    table: Callable[[list[Run]], str],
) -> int:
    """A tool's command line: ``load`` each file named (every kept result when none), then print
    a JSON line a run with --json, else the table. A file that cannot be read ends it with one
    line on stderr naming the file, and 1."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="userd_fetch.py results")
    parser.add_argument("--json", action="store_true", help="one JSON object a run")
    args = parser.parse_args(argv)
    files = args.files or sorted(RESULTS.glob("*userd-fetch*.json.xz"))
    if not files:
        print(f"no userd_fetch results in {RESULTS}", file=sys.stderr)
        return 1
    try:
        runs = [load(p) for p in files]
    except (BadResult, Unreadable) as err:
        print(f"{tool}: {err}", file=sys.stderr)
        return 1
    print("\n".join(as_json(run) for run in runs) if args.json else table(runs))
    return 0
