"""What a daemon's debug log says about one pod's turns: how soon a pod that read idle was found
running again, the turns handed back to it, the controls sent, the GPU time it used per period.

`tools/gpu/bench-gpu.sh --daemon-logs` keeps the daemon's log of each qpolicy run (the rm
enforcer at debug level). The lines read here are the sensor's "pod P: idle (...)" and
"pod P: busy (N preemption saves while idle)" or "busy (N launches, ...)", the slicer's
"pod P: turn handed back by ...", the control's "pod P: open|close ...", and the enforcer's
"period used P 12.3 ms ...". Times are the log's own (ms since the daemon started).

    python3 tools/gpu/daemon_turns.py LOG_OR_TAR_XZ [--pod NAME] [--json]
        [--bench BENCH_JSON_XZ --online POD --offline POD,POD [--shift-ms MS ...]]

A ``.tar.xz`` (as the results directory keeps them) is read member by member: one report per
log in it.

With ``--bench`` (the bench's JSON of the same run, whose qpolicy row has the online pod's
latencies in release order, at a fixed rate), each request is placed on the log's clock and
counted under the offline pod whose channels alone were open then: the requests over 1 ms per
holder. The two clocks are not tied: request 0 is put 20 s of requests before the last
period in which the online pod used the GPU, and ``--shift-ms`` moves that guess; a finding
that holds at every shift does not depend on it.

Also with ``--bench``, ``slow_near_controls``: since the two clocks are not tied to the
millisecond, every shift within ``--search-ms`` (0.5 ms steps) is tried, and at each the slow
requests released within 3 ms after an open or close line (or 1 ms before it) are counted. A
cause in the controls shows as one shift where many more of them are near one than at the
median shift (what chance gives with the controls' and requests' own rhythms); at that shift,
each kind of control's requests and their slow fraction, against the requests near none.
"""

from __future__ import annotations

import argparse
import bisect
import json
import lzma
import re
import statistics
import sys
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.gpu.result_json import read_json

LINE = re.compile(
    r"^qpolicy daemon:\s+(?P<ms>\d+(?:\.\d+)?) ms \w+ (?P<logger>[\w.]+): (?P<text>.*)$"
)
SENSOR = re.compile(r"^pod (?P<pod>\S+): (?P<state>idle|busy) \((?P<why>.*)\)$")
SAVES = re.compile(r"^(?P<saves>\d+) preemption saves while idle$")
HANDED_BACK = re.compile(r"^pod (?P<pod>\S+): turn handed back by (?P<by>\S+) ")
CONTROL = re.compile(r"^pod (?P<pod>\S+): (?P<what>open|close) ")
PERIOD = re.compile(r"^period used (?P<rest>.*)$")
USED = re.compile(r"(?P<pod>\S+) (?P<ms>\d+(?:\.\d+)?) ms")


def names(name: str, pod: str) -> bool:
    """Whether the log's pod path ``name`` is ``pod``: the path, or its last component."""
    return name == pod or name.rsplit("/", 1)[-1] == pod


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

    for raw in lines:
        match = LINE.match(raw.rstrip("\n"))
        if match is None:
            continue
        at, text = float(match["ms"]), match["text"]
        first = at if first is None else first
        last = at
        if (m := SENSOR.match(text)) and names(m["pod"], pod):
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
        elif (m := HANDED_BACK.match(text)) and names(m["pod"], pod):
            # The idle read before it is the one the sensor's busy line has just ended.
            report.handed_back_ms.append(stood)
        elif (m := CONTROL.match(text)) and match["logger"].endswith("control"):
            report.controls += 1
        elif m := PERIOD.match(text):
            for used in USED.finditer(m["rest"]):
                if names(used["pod"].rstrip(","), pod):
                    report.periods_used_ms.append(float(used["ms"]))
    report.span_ms = last - first if first is not None else 0.0
    return report


def control_lines(lines: Iterable[str]) -> Iterator[tuple[float, str, str]]:
    """(log ms, "open" or "close", the pod's path) of each of the control's open and close
    lines."""
    for raw in lines:
        match = LINE.match(raw.rstrip("\n"))
        if match is None or not match["logger"].endswith("control"):
            continue
        if (control := CONTROL.match(match["text"])) is not None:
            yield float(match["ms"]), control["what"], control["pod"]


def holders(lines: Iterable[str], offline: list[str]) -> list[tuple[float, float, str]]:
    """(start, end, who) spans of the log: the one ``offline`` pod (path or last component) whose
    channels alone were open, "several", or "none", from the control's open and close lines
    (every pod open until its first close)."""
    open_now = dict.fromkeys(offline, True)
    spans: list[tuple[float, float, str]] = []
    since: float | None = None

    def who() -> str:
        names = [name for name, is_open in open_now.items() if is_open]
        return names[0] if len(names) == 1 else ("none" if not names else "several")

    for at, what, pod in control_lines(lines):
        name = next((o for o in offline if names(pod, o)), None)
        if name is None:
            continue
        if since is not None:
            spans.append((since, at, who()))
        open_now[name] = what == "open"
        since = at
    return spans


def last_active_ms(lines: Iterable[str], pod: str) -> float | None:
    """The log time of the last "period used" line that counts GPU time for ``pod``."""
    last = None
    for raw in lines:
        match = LINE.match(raw.rstrip("\n"))
        if match is None or not (period := PERIOD.match(match["text"])):
            continue
        for used in USED.finditer(period["rest"]):
            if names(used["pod"].rstrip(","), pod) and float(used["ms"]) > 0:
                last = float(match["ms"])
    return last


def slow_by_holder(
    latencies_ms: list[float],
    rate_hz: float,
    first_ms: float,
    spans: list[tuple[float, float, str]],
    over_ms: float = 1.0,
) -> dict[str, dict[str, float]]:
    """Requests released every 1 / ``rate_hz`` from ``first_ms`` on the log's clock, counted per
    holder (``spans``; "unknown" outside them): how many, how many over ``over_ms``, and the
    fraction."""
    counts: dict[str, list[int]] = {}
    index = 0
    for i, latency in enumerate(latencies_ms):
        at = first_ms + i * 1000.0 / rate_hz
        while index < len(spans) and spans[index][1] <= at:
            index += 1
        inside = index < len(spans) and spans[index][0] <= at
        tally = counts.setdefault(spans[index][2] if inside else "unknown", [0, 0])
        tally[0] += 1
        tally[1] += latency > over_ms
    return {
        who: {"requests": n, "slow": slow, "fraction": round(slow / n, 4)}
        for who, (n, slow) in sorted(counts.items())
    }


def controls(lines: Iterable[str]) -> list[tuple[float, str]]:
    """(log ms, "open POD" or "close POD") of the control's lines, POD the path's last part."""
    return [(at, f"{what} {pod.rsplit('/', 1)[-1]}") for at, what, pod in control_lines(lines)]


#: A request counts as near a control released from BEFORE_MS before its line to AFTER_MS after:
#: the line is written around the call, which takes 0.6-1.3 ms under GSP (h200-findings).
NEAR_BEFORE_MS, NEAR_AFTER_MS = 3.0, 1.0


def slow_near_controls(
    latencies_ms: list[float],
    rate_hz: float,
    first_ms: float,
    events: list[tuple[float, str]],
    search_ms: float = 800.0,
    over_ms: float = 1.0,
) -> dict[str, object]:
    """The shift (within ±``search_ms``, 0.5 ms steps) at which most requests over ``over_ms``
    were released near a control (``events``, sorted); how many there, the median over all
    shifts, and at that shift each kind of control's requests, slow ones and median latency."""
    times = [t for t, _ in events]
    gap = 1000.0 / rate_hz
    slow = [i for i, x in enumerate(latencies_ms) if x > over_ms]

    def near(i: int, shift: float) -> int | None:
        at = first_ms + shift + i * gap
        j = bisect.bisect_left(times, at - NEAR_BEFORE_MS)
        return j if j < len(times) and times[j] <= at + NEAR_AFTER_MS else None

    hits = []
    for step in range(-round(search_ms * 2), round(search_ms * 2) + 1):
        shift = step / 2
        hits.append((sum(near(i, shift) is not None for i in slow), -abs(shift), shift))
    best_hits, _, best = max(hits)
    kinds: dict[str, list[float]] = {}
    for i, latency in enumerate(latencies_ms):
        j = near(i, best)
        kinds.setdefault("none" if j is None else events[j][1], []).append(latency)
    return {
        "slow": len(slow),
        "shift_ms": best,
        "slow_near_a_control": best_hits,
        "median_over_shifts": statistics.median(h for h, _, _ in hits),
        "by_control": {
            kind: {
                "requests": len(xs),
                "slow": sum(1 for x in xs if x > over_ms),
                "median_ms": round(statistics.median(xs), 3),
            }
            for kind, xs in sorted(kinds.items())
        },
    }


def bench_latencies(path: Path, online: str) -> tuple[list[float], float]:
    """The qpolicy row's ``online`` latencies and the release rate, from a bench JSON(.xz)."""
    data = read_json(path)
    for runs in data["scenarios"].values():
        for run in runs:
            if run.get("mode") == "qpolicy":
                pod = run["pods"][online]
                # Released at a fixed rate (the bench's rows are not Poisson): so many a second.
                return [float(x) for x in pod["latencies_ms"]], pod["requests"] / pod["seconds"]
    raise ValueError(f"no qpolicy run in {path}")


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
    parser.add_argument("--bench", type=Path, help="the bench JSON(.xz) of the same run")
    parser.add_argument("--online", default="online", help="the online pod, with --bench")
    parser.add_argument(
        "--offline", default="trainer,long", help="the offline pods, comma-separated (--bench)"
    )
    parser.add_argument(
        "--shift-ms", type=float, nargs="*", default=[-400.0, -200.0, 0.0, 200.0, 400.0]
    )
    parser.add_argument(
        "--search-ms", type=float, default=800.0, help="shifts tried for slow_near_controls"
    )
    args = parser.parse_args(argv)
    if not args.path.is_file():
        print(f"daemon_turns: no such file: {args.path}", file=sys.stderr)
        return 2
    try:
        read = list(logs(args.path))
    except (tarfile.TarError, OSError, EOFError) as error:
        print(f"daemon_turns: cannot read {args.path}: {error}", file=sys.stderr)
        return 2
    reports = [parse(lines, name, args.pod).summary() for name, lines in read]
    if args.bench is not None:
        try:
            latencies, rate = bench_latencies(args.bench, args.online)
        except (OSError, EOFError, lzma.LZMAError, ValueError, KeyError) as error:
            print(f"daemon_turns: cannot read {args.bench}: {error}", file=sys.stderr)
            return 2
        for summary, (_, lines) in zip(reports, read, strict=True):
            last = last_active_ms(lines, args.online)
            if last is None:
                continue
            spans = holders(lines, args.offline.split(","))
            first = last - len(latencies) * 1000.0 / rate
            summary["slow_by_holder"] = {
                f"{shift:+.0f} ms": slow_by_holder(latencies, rate, first + shift, spans)
                for shift in args.shift_ms
            }
            summary["slow_near_controls"] = slow_near_controls(
                latencies, rate, first, controls(lines), args.search_ms
            )
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
