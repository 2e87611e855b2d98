"""Which of a CUDA process's channels carry its work, from tools/gpu/userd_fetch.py's raw results.

qgpu reads a channel's USERD only every dormant_look_us (32 ms) once the channel has shown no
work for a second after it became readable (kmod/qgpu/userd.c), on the evidence that CUDA makes
20 channels a context and feeds few of them. This prints that evidence from the watcher's raw
events: per run, each channel's submissions (changes of GP_PUT after the watcher's first read of
its slot) and when the last one came, and the channels that had any work after the run's first
timed request began, when the context had long been set up.

    python3 tools/gpu/channel_use.py [--json] [RESULT.json.xz ...]

With no files, every `*userd-fetch*.json.xz` in tools/gpu/results/. A run's events are
[time ns, channel, GP_GET, GP_PUT, ...]; its requests' start times are `raw_timeline[].t0`.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.gpu.result_json import read_object
from tools.gpu.userd_fetch import events_by_channel
from tools.gpu.userd_results import BadResult, gpu_of, main_over_results, name_of


@dataclass(frozen=True)
class Channel:
    """One channel's work as the watcher saw it; times in ms after the run's first event."""

    index: int
    submissions: int
    last_ms: float | None  # the last submission's time, None for none
    after_first_request: int  # submissions from the first timed request on


@dataclass(frozen=True)
class ChannelUse:
    """One run: its channels, and when its first timed request began and its last event came."""

    name: str
    gpu: str
    first_request_ms: float
    end_ms: float
    channels: list[Channel]

    @property
    def working(self) -> list[int]:
        """The channels with work after the first timed request."""
        return [c.index for c in self.channels if c.after_first_request]

    @property
    def setup_only_until_ms(self) -> float:
        """The last submission of any channel without work after the first request."""
        return max(
            (c.last_ms for c in self.channels if not c.after_first_request and c.last_ms),
            default=0.0,
        )


def _event(name: str, event: Any) -> list[int]:
    """[time, channel, GP_GET, GP_PUT], checked."""
    if (
        not isinstance(event, list)
        or len(event) < 4
        or not all(isinstance(v, int) for v in event[:4])
    ):
        raise BadResult(f"{name}: event {event!r} is not [time, channel, GP_GET, GP_PUT, ...]")
    return event[:4]


def channel_use(name: str, data: dict[str, Any]) -> ChannelUse:
    """Each channel's submissions in one result, against its first timed request."""
    raw = data.get("raw_events")
    timeline = data.get("raw_timeline")
    if not isinstance(raw, list) or not raw:
        raise BadResult(f"{name}: no raw_events")
    if not isinstance(timeline, list) or not timeline:
        raise BadResult(f"{name}: no raw_timeline of requests")
    starts = [r.get("t0") for r in timeline if isinstance(r, dict)]
    if len(starts) != len(timeline) or not all(isinstance(t, int) for t in starts):
        raise BadResult(f"{name}: a request of raw_timeline without a t0 in ns")
    events = sorted(_event(name, e) for e in raw)
    start = events[0][0]
    first_request = min(starts)
    by_channel = events_by_channel({"events": events})
    channels = []
    for index, seen in sorted(by_channel.items()):
        # The first event of a slot is the watcher's first read of it, not work.
        moves = [t for (_, _, before), (t, _, put) in itertools.pairwise(seen) if put != before]
        channels.append(
            Channel(
                index=index,
                submissions=len(moves),
                last_ms=(moves[-1] - start) / 1e6 if moves else None,
                after_first_request=sum(t >= first_request for t in moves),
            )
        )
    return ChannelUse(
        name=name,
        gpu=gpu_of(name),
        first_request_ms=(first_request - start) / 1e6,
        end_ms=(events[-1][0] - start) / 1e6,
        channels=channels,
    )


def load(path: Path) -> ChannelUse:
    return channel_use(name_of(path), read_object(path))


def table(runs: list[ChannelUse]) -> str:
    lines = [
        "| raw file | GPU | channels | with work after the first request | their submissions "
        "| the others' last work, ms | first request, ms | last event, ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        working = run.working
        subs = sum(c.submissions for c in run.channels if c.index in working)
        lines.append(
            f"| {run.name} | {run.gpu} | {len(run.channels)} | "
            f"{len(working)} ({', '.join(map(str, working)) or 'none'}) | {subs} | "
            f"{run.setup_only_until_ms:.1f} | {run.first_request_ms:.1f} | {run.end_ms:.0f} |"
        )
    idle = sum(len(r.channels) - len(r.working) for r in runs)
    total = sum(len(r.channels) for r in runs)
    lines.append(
        f"\n{idle} of {total} channels in {len(runs)} runs showed work only before the first "
        "request, and never after it."
    )
    return "\n".join(lines)


def as_json(run: ChannelUse) -> str:
    return json.dumps({**asdict(run), "working": run.working})


def main(argv: list[str] | None = None) -> int:
    return main_over_results(argv, __doc__ or "", "channel_use", load, as_json, table)


if __name__ == "__main__":
    raise SystemExit(main())
