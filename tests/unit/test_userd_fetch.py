"""tools/gpu/userd_fetch.py: its analyses, held to the H100 recordings they made.

The recordings keep the watcher's raw events and the process's own timings: analysing them again
must give the summaries recorded on the GPU, and what they say is what qgpu's busy detection and
nvmock's fetch model rest on (kmod/nvmock/CONFORMANCE.md, "GP_GET").
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from tools.gpu import userd_fetch

RESULTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "results"


def recording(name: str) -> dict[str, Any]:
    with lzma.open(RESULTS / name) as f:
        data: dict[str, Any] = json.load(f)
    return data


def reanalysed(data: dict[str, Any]) -> dict[str, Any]:
    watch = {"events": data["raw_events"]}
    by_channel = userd_fetch.events_by_channel(watch)
    result = userd_fetch.analyse(by_channel, data["raw_timeline"])
    result["summary"].update(userd_fetch.analyse_trainers(by_channel, data["raw_trainers"]))
    pushbuffer = userd_fetch.events_by_channel(watch, (5, 4))
    result["pushbuffer"] = userd_fetch.analyse_pushbuffer(
        pushbuffer, userd_fetch.top_level_gets(watch), result["requests"], data["raw_timeline"]
    )
    result["pushbuffer"].update(userd_fetch.analyse_trainers(pushbuffer, data["raw_trainers"]))
    return result


TENTH = [f"2026-11-27-userd-fetch-{n}-h100-call10A.json.xz" for n in (16384, 8192)] + [
    f"2026-11-27-userd-fetch-{n}-h200-call10C.json.xz" for n in (16384, 8192)
]


@pytest.mark.parametrize("name", TENTH)
def test_the_recorded_summaries_follow_from_the_raw_events(name: str) -> None:
    data = recording(name)
    result = reanalysed(data)
    assert result["summary"] == data["summary"]
    assert result["pushbuffer"] == data["pushbuffer"]


@pytest.mark.parametrize("gpu", ["h100-call10A", "h200-call10C"])
def test_no_word_of_userd_stays_behind_while_a_fetched_kernel_runs(gpu: str) -> None:
    """What qgpu cannot see, measured on both GPU models: the pushbuffer's Get reaches its Put
    when GP_GET reaches GP_PUT, early in an 11 ms kernel, and TopLevelGet never moves; so a
    kernel taken off the GPU after its fetch leaves no trace in USERD (the "owed" cgroups of
    sched.c)."""
    data = recording(f"2026-11-27-userd-fetch-16384-{gpu}.json.xz")
    one = data["pushbuffer"]["1 kernel(s) a request"]
    assert one["pb_caught_up"] == 100
    assert one["pb_caught_up_share_max"] < 0.1
    assert one["pb_pending_at_end"] == 0
    assert one["top_level_get_moved"] == 0
    gp = data["summary"]["1 kernel(s) a request"]
    assert gp["caught_up_share_of_request_max"] < 0.1


def test_old_recordings_have_no_pushbuffer_words() -> None:
    data = recording("2026-11-26-userd-fetch-16384-h100.json.xz")
    watch = {"events": data["raw_events"]}
    by_channel = userd_fetch.events_by_channel(watch)
    assert userd_fetch.analyse(by_channel, data["raw_timeline"])["summary"] == {
        k: v for k, v in data["summary"].items() if not k.startswith("trainer")
    }
    with pytest.raises(ValueError, match="has no field 5"):
        userd_fetch.events_by_channel(watch, (5, 4))
    assert userd_fetch.top_level_gets(watch) == {}


def test_pending_share_counts_the_time_get_and_put_differ() -> None:
    events = [(0, 1, 1), (10, 1, 2), (30, 2, 2), (60, 2, 3), (70, 3, 3)]
    assert userd_fetch.pending_share(events, 0, 100) == pytest.approx(0.3)
    assert userd_fetch.pending_share(events, 20, 40) == pytest.approx(0.5)
