"""What one USERD load across PCIe costs a CPU, from tools/gpu/userd_fetch.py's raw results.

qgpu's scheduler reads each gated channel's GP_GET and GP_PUT in USERD, which lives in vidmem
behind BAR1: every load is an uncached read across PCIe. The GPU hosts load only signed modules,
so qgpu's own reads were never timed there; userd_fetch.py's watcher times the same kind of load
from inside a CUDA process. Its thread loads each of the process's mapped USERD slots in a tight
loop and counts the slots it read. The run's events (the first read of each slot, and every
change) span part of the time the watcher ran, so the span divided by the loads is a lower bound
on the time a load took (loop and bookkeeping included, which are small next to a microsecond).

    python3 tools/gpu/userd_read_cost.py [--json] [RESULT.json.xz ...]

With no files, every `*userd-fetch*.json.xz` in tools/gpu/results/. Loads a read: the result's
`loads_per_read`, else the watcher's version, told by the width of its events: 373a704's loaded
one word a slot (events of 4 fields), 024298e's three (GP_GET, Put, TopLevelGet; 7 fields).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.gpu.result_json import read_object
from tools.gpu.userd_results import BadResult, gpu_of, main_over_results, name_of

LOADS_BY_EVENT_WIDTH = {4: 1, 7: 3}


@dataclass(frozen=True)
class ReadCost:
    """One run's watcher: how many slots it read, in how long."""

    name: str
    gpu: str
    reads: int
    loads_per_read: int
    span_s: float

    @property
    def us_per_read(self) -> float:
        return self.span_s * 1e6 / self.reads

    @property
    def us_per_load(self) -> float:
        return self.us_per_read / self.loads_per_read


def read_cost(name: str, data: dict[str, Any]) -> ReadCost:
    """The watcher's cost per read and per load in one result."""
    events = data.get("raw_events")
    reads = data.get("reads")
    if not isinstance(events, list) or len(events) < 2:
        raise BadResult(f"{name}: no raw_events to span")
    if not isinstance(reads, int) or reads <= 0:
        raise BadResult(f"{name}: reads is {reads!r}, not a positive count")
    widths = {len(e) for e in events if isinstance(e, list)}
    loads = data.get("loads_per_read")
    if loads is None:
        if len(widths) != 1 or next(iter(widths)) not in LOADS_BY_EVENT_WIDTH:
            raise BadResult(f"{name}: events of widths {sorted(widths)}, not a known watcher's")
        loads = LOADS_BY_EVENT_WIDTH[next(iter(widths))]
    if not isinstance(loads, int) or loads <= 0:
        raise BadResult(f"{name}: loads_per_read is {loads!r}")
    times = [e[0] for e in events if isinstance(e, list) and e and isinstance(e[0], int)]
    if len(times) != len(events):
        raise BadResult(f"{name}: an event without a time in ns")
    span = (max(times) - min(times)) / 1e9
    if span <= 0:
        raise BadResult(f"{name}: its events span no time")
    return ReadCost(name, gpu_of(name), reads, loads, span)


def load(path: Path) -> ReadCost:
    return read_cost(name_of(path), read_object(path))


def table(costs: list[ReadCost]) -> str:
    lines = [
        "| raw file | GPU | loads a read | µs a read | µs a load |",
        "|---|---|---|---|---|",
    ]
    for c in costs:
        lines.append(
            f"| {c.name} | {c.gpu} | {c.loads_per_read} | {c.us_per_read:.2f} "
            f"| {c.us_per_load:.2f} |"
        )
    for gpu in sorted({c.gpu for c in costs}):
        per_load = [c.us_per_load for c in costs if c.gpu == gpu]
        lines.append(
            f"\n{gpu}: {min(per_load):.2f} to {max(per_load):.2f} µs a load in {len(per_load)} runs"
        )
    return "\n".join(lines)


def as_json(cost: ReadCost) -> str:
    return json.dumps({**asdict(cost), "us_per_read": cost.us_per_read,
                       "us_per_load": cost.us_per_load})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return main_over_results(argv, __doc__ or "", "userd_read_cost", load, as_json, table)


if __name__ == "__main__":
    raise SystemExit(main())
