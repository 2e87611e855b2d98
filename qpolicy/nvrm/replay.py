"""Replaying a recorded trace through the tracker: ``qpolicy trace --replay``."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from qpolicy.errors import ValidationError
from qpolicy.nvrm.records import BadLine, Record, read_records
from qpolicy.nvrm.tracker import Summary, Tracker

BUILTIN_TRACE = "h200-pytorch-matmul"
BAD_LINES_KEPT = 20


@dataclass(frozen=True, slots=True)
class ReplayResult:
    source: str
    records: int
    malformed: int
    malformed_examples: tuple[BadLine, ...]
    processes: tuple[Summary, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "records": self.records,
            "malformed": {
                "count": self.malformed,
                "examples": [asdict(bad) for bad in self.malformed_examples],
            },
            "processes": [summary_json(summary) for summary in self.processes],
        }


def summary_json(summary: Summary) -> dict[str, Any]:
    data = asdict(summary)
    data["ioctls"] = summary.ioctls
    data["channel_count"] = summary.channel_count
    data["slowest"] = [asdict(slow) for slow in summary.slowest]
    return data


@contextmanager
def open_trace(source: str) -> Iterator[TextIO]:
    """A trace file (``.gz`` or plain), or the trace shipped with qpolicy by name."""
    path = Path(source)
    if not path.exists() and source == BUILTIN_TRACE:
        data = resources.files("qpolicy.nvrm").joinpath(f"data/{BUILTIN_TRACE}.jsonl.gz")
        with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
            yield text
        return
    try:
        # Closed by the with-block below; opening it here keeps the error messages apart.
        handle: TextIO = (
            gzip.open(path, "rt", encoding="utf-8", errors="replace")  # noqa: SIM115
            if path.suffix == ".gz"
            else path.open(encoding="utf-8", errors="replace")
        )
    except OSError as error:
        raise ValidationError(
            f"cannot read trace {source!r}: {error.strerror} (or use the shipped {BUILTIN_TRACE!r})"
        ) from None
    with handle:
        try:
            yield handle
        except (OSError, EOFError, gzip.BadGzipFile) as error:
            raise ValidationError(f"cannot read trace {source!r}: {error}") from None


def replay_lines(lines: TextIO | io.StringIO, source: str) -> ReplayResult:
    tracker = Tracker()
    records = 0
    malformed = 0
    examples: list[BadLine] = []
    for item in read_records(lines):
        if isinstance(item, BadLine):
            malformed += 1
            if len(examples) < BAD_LINES_KEPT:
                examples.append(item)
            continue
        records += 1
        tracker.feed(item)
    return ReplayResult(
        source=source,
        records=records,
        malformed=malformed,
        malformed_examples=tuple(examples),
        processes=tuple(
            tracker.summary(pid)
            for pid in sorted(tracker.processes, key=lambda pid: (pid is not None, pid or 0))
        ),
    )


def replay(source: str) -> ReplayResult:
    with open_trace(source) as lines:
        return replay_lines(lines, source)


def builtin_records() -> list[Record]:
    """The shipped H200 trace as records (the simulator's telemetry source plays it)."""
    with open_trace(BUILTIN_TRACE) as lines:
        return [item for item in read_records(lines) if isinstance(item, Record)]
