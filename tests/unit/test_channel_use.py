"""tools/gpu/channel_use.py: which channels carry a CUDA process's work, the evidence behind
qgpu's dormant channels (kmod/qgpu/userd.c), from the raw userd_fetch results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tools.gpu import channel_use
from tools.gpu.channel_use import channel_use as use
from tools.gpu.userd_results import BadResult

MS = 1_000_000


def event(ms: float, channel: int, put: int) -> list[int]:
    return [int(ms * MS), channel, 0, put, 0, 0, 0]


def run(events: list[list[int]], first_request_ms: float = 100.0) -> dict[str, object]:
    return {"raw_events": events, "raw_timeline": [{"t0": int(first_request_ms * MS)}]}


def test_a_slots_first_read_is_not_work_and_each_change_of_gp_put_is() -> None:
    result = use(
        "x-h200",
        run(
            [
                event(0, 0, 5),  # first reads: GP_PUT as CUDA left it
                event(1, 1, 3),
                event(40, 1, 4),  # setup work on channel 1
                event(90, 1, 4),  # GP_GET moved, GP_PUT did not: no submission
                event(150, 0, 6),  # a request's kernel on channel 0
                event(170, 0, 7),
            ]
        ),
    )
    assert result.gpu == "H200"
    assert result.working == [0]
    by = {c.index: c for c in result.channels}
    assert (by[0].submissions, by[0].after_first_request, by[0].last_ms) == (2, 2, 170.0)
    assert (by[1].submissions, by[1].after_first_request, by[1].last_ms) == (1, 0, 40.0)
    assert result.setup_only_until_ms == 40.0
    assert (result.first_request_ms, result.end_ms) == (100.0, 170.0)


def test_times_count_from_the_first_event_whatever_the_order_kept() -> None:
    result = use("x", run([event(300, 0, 2), event(200, 0, 1)], first_request_ms=250))
    assert result.channels[0].last_ms == 100.0 and result.first_request_ms == 50.0
    assert result.working == [0]


def test_a_channel_never_fed_has_no_last_work() -> None:
    result = use("x", run([event(0, 3, 0), event(500, 3, 0)]))
    assert result.channels[0].last_ms is None and result.working == []
    assert result.setup_only_until_ms == 0.0


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"raw_timeline": [{"t0": 1}]}, "no raw_events"),
        ({"raw_events": [event(0, 0, 0)]}, "no raw_timeline"),
        ({"raw_events": [event(0, 0, 0)], "raw_timeline": [{"t1": 1}]}, "without a t0"),
        ({"raw_events": [[0, 0, 0]], "raw_timeline": [{"t0": 1}]}, "is not [time"),
        ({"raw_events": [[0.5, 0, 0, 0]], "raw_timeline": [{"t0": 1}]}, "is not [time"),
    ],
)
def test_what_cannot_be_read_is_named(data: dict[str, object], words: str) -> None:
    with pytest.raises(BadResult, match=re.escape(words)):
        use("bad-run", data)


def test_the_recorded_runs_show_one_channel_of_twenty_fed_after_setup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What README and kmod/qgpu/userd.c quote: in each of the ten kept runs (eight H100, two
    H200) only channel 0 had work after the first request, and the other 19 last had some 76-129
    ms after the watcher first read them."""
    assert channel_use.main(["--json"]) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(runs) == 10
    assert sorted(r["gpu"] for r in runs) == ["H100"] * 8 + ["H200"] * 2
    for r in runs:
        assert len(r["channels"]) == 20 and r["working"] == [0]
    last = [
        max(c["last_ms"] for c in r["channels"] if c["index"] != 0 and c["last_ms"]) for r in runs
    ]
    assert min(last) >= 76 and max(last) < 130
    assert channel_use.main([]) == 0
    assert "190 of 200 channels in 10 runs" in capsys.readouterr().out


def test_a_file_it_cannot_read_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("[1]")
    assert channel_use.main([str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err
