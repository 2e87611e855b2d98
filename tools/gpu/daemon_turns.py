"""What a daemon's debug log says about one pod's turns: how soon a pod that read idle was found
running again, the turns handed back to it, the controls sent, the GPU time it used per period.

`tools/gpu/bench-gpu.sh --daemon-logs` keeps the daemon's log of each qpolicy run (the rm
enforcer at debug level). The lines read here are the sensor's "pod P: idle (...)" and
"pod P: busy (N preemption saves while idle)" or "busy (N launches, ...)", the slicer's
"pod P: turn handed back by ...", the control's "pod P: open|close ...", and the enforcer's
"period used P 12.3 ms ...". Times are the log's own (ms since the daemon started).

    python3 tools/gpu/daemon_turns.py LOG_OR_TAR_XZ [--pod NAME] [--json]

A ``.tar.xz`` (as the results directory keeps them) is read member by member: one report per
log in it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

LINE = re.compile(
    r"^qpolicy daemon:\s+(?P<ms>\d+(?:\.\d+)?) ms \w+ (?P<logger>[\w.]+): (?P<text>.*)$"
)
SENSOR = re.compile(r"^pod (?P<pod>\S+): (?P<state>idle|busy) \((?P<why>.*)\)$")
SAVES = re.compile(r"^(?P<saves>\d+) preemption saves while idle$")
HANDED_BACK = re.compile(r"^pod (?P<pod>\S+): turn handed back by (?P<by>\S+) ")
CONTROL = re.compile(r"^pod (?P<pod>\S+): (?P<what>open|close) ")
PERIOD = re.compile(r"^period used (?P<rest>.*)$")
USED = re.compile(r"(?P<pod>\S+) (?P<ms>\d+(?:\.\d+)?) ms")


@dataclass
class Report:
    """One pod's turns in one log."""

    log: str
    pod: str
    span_ms: float = 0.0
    idle_reads: int = 0
    #: After each idle read, when the GPU check found the pod running: ms since, and the saves.
    found_running_ms: list[float] = field(default_factory=list)
    found_running_saves: list[int] = field(default_factory=list)
    #: After each idle read, when a launch or wait of its own made it busy: ms since.
    woke_ms: list[float] = field(default_factory=list)
    #: Turns handed back to it: how long the idle read before each stood.
    handed_back_ms: list[float] = field(default_factory=list)
    controls: int = 0
    periods_used_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        def spread(values: list[float] | list[int]) -> dict[str, float] | None:
            if not values:
                return None
            return {
                "min": min(values),
                "median": round(statistics.median(values), 2),
                "max": max(values),
            }

        return {
            "log": self.log,
            "pod": self.pod,
            "idle_reads": self.idle_reads,
            "found_running": len(self.found_running_ms),
            "found_running_ms": spread(self.found_running_ms),
            "found_running_saves": spread(self.found_running_saves),
            "woke": len(self.woke_ms),
            "handed_back": len(self.handed_back_ms),
            "handed_back_ms": spread(self.handed_back_ms),
            "controls": self.controls,
            "controls_per_s": self.controls / (self.span_ms / 1000) if self.span_ms else 0.0,
            "periods": len(self.periods_used_ms),
            # GPU time the enforcer counted for it, over the log's span.
            "used_share": sum(self.periods_used_ms) / self.span_ms if self.span_ms else 0.0,
        }


def parse(lines: Iterable[str], log: str, pod: str) -> Report:
    """The report of ``pod`` (a pod path, or its last component) over ``lines``."""
    report = Report(log, pod)
    first: float | None = None
    idle_at: float | None = None
    last = 0.0
    # How long the pod's last idle read stood before a busy line ended it.
    stood = float("nan")

    def ours(name: str) -> bool:
        return name == pod or name.rsplit("/", 1)[-1] == pod

    for raw in lines:
        match = LINE.match(raw.rstrip("\n"))
        if match is None:
            continue
        at, text = float(match["ms"]), match["text"]
        first = at if first is None else first
        last = at
        if (m := SENSOR.match(text)) and ours(m["pod"]):
            if m["state"] == "idle":
                report.idle_reads += 1
                idle_at = at
            elif idle_at is not None:
                stood = round(at - idle_at, 1)
                saves = SAVES.match(m["why"])
                if saves:
                    report.found_running_ms.append(stood)
                    report.found_running_saves.append(int(saves["saves"]))
                else:
                    report.woke_ms.append(stood)
                idle_at = None
        elif (m := HANDED_BACK.match(text)) and ours(m["pod"]):
            # The idle read before it is the one the sensor's busy line has just ended.
            report.handed_back_ms.append(stood)
        elif (m := CONTROL.match(text)) and match["logger"].endswith("control"):
            report.controls += 1
        elif m := PERIOD.match(text):
            for used in USED.finditer(m["rest"]):
                if ours(used["pod"].rstrip(",")):
                    report.periods_used_ms.append(float(used["ms"]))
    report.span_ms = last - first if first is not None else 0.0
    return report


def logs(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(name, lines) of each log in ``path``: a log, or a .tar.xz of logs."""
    if path.name.endswith(".tar.xz"):
        with tarfile.open(path, "r:xz") as archive:
            for member in sorted(archive.getmembers(), key=lambda m: m.name):
                if not member.isfile() or not member.name.endswith(".log"):
                    continue
                data = archive.extractfile(member)
                if data is not None:
                    yield member.name, data.read().decode("utf-8", "replace").splitlines()
        return
    yield path.name, path.read_text(encoding="utf-8", errors="replace").splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a daemon log, or a .tar.xz of them")
    parser.add_argument("--pod", default="long", help="the pod (its path or last component)")
    parser.add_argument("--json", action="store_true", help="one JSON object per log")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        print(f"daemon_turns: no such file: {args.path}", file=sys.stderr)
        return 2
    try:
        reports = [parse(lines, name, args.pod).summary() for name, lines in logs(args.path)]
    except (tarfile.TarError, OSError, EOFError) as error:
        print(f"daemon_turns: cannot read {args.path}: {error}", file=sys.stderr)
        return 2
    for summary in reports:
        if args.json:
            print(json.dumps(summary))
            continue
        print(f"{summary['log']}: pod {summary['pod']}")
        for key, value in summary.items():
            if key not in ("log", "pod"):
                print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
