"""tools/gpu/userd_read_cost.py: the per-load cost BENCHMARKS.md quotes, from the raw results."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import pytest

from tools.gpu import userd_fetch, userd_read_cost
from tools.gpu.userd_read_cost import BadResult, read_cost

GPU_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"


def events(width: int, times: list[int]) -> list[list[int]]:
    return [[t] + [0] * (width - 1) for t in times]


def test_three_word_watcher_divides_the_span_by_three_loads_a_read() -> None:
    cost = read_cost("x-h200", {"reads": 1000, "raw_events": events(7, [5_000, 3_005_000])})
    assert cost.gpu == "H200"
    assert cost.loads_per_read == 3
    assert cost.us_per_read == pytest.approx(3.0)
    assert cost.us_per_load == pytest.approx(1.0)


def test_one_word_watcher_loads_once_a_read() -> None:
    cost = read_cost("x-h100", {"reads": 2000, "raw_events": events(4, [0, 1_000, 2_200_000])})
    assert (cost.loads_per_read, cost.gpu) == (1, "H100")
    assert cost.us_per_load == pytest.approx(1.1)


def test_a_recorded_loads_per_read_wins_over_the_event_width() -> None:
    data = {"reads": 100, "loads_per_read": 2, "raw_events": events(7, [0, 400_000])}
    assert read_cost("x", data).us_per_load == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"reads": 10, "raw_events": events(5, [0, 10])}, "widths [5]"),
        ({"reads": 10, "raw_events": events(4, [0]) + events(7, [9])}, "widths [4, 7]"),
        ({"reads": 0, "raw_events": events(4, [0, 10])}, "reads is 0"),
        ({"reads": 10, "raw_events": events(4, [0])}, "no raw_events"),
        ({"reads": 10, "raw_events": events(4, [7, 7])}, "span no time"),
        ({"reads": 10, "loads_per_read": 0, "raw_events": events(4, [0, 9])}, "loads_per_read"),
        ({"reads": 10, "raw_events": [[0, 0, 0, 0], ["t", 0, 0, 0]]}, "without a time"),
    ],
)
def test_what_cannot_be_read_is_named(data: dict[str, object], words: str) -> None:
    with pytest.raises(BadResult, match=re.escape(words)):
        read_cost("bad-run", data)


def test_the_recorded_runs_give_about_a_microsecond_a_load_on_both_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """BENCHMARKS.md's 1.03-1.20 µs a load (thirty-eighth session) is what these files say."""
    assert userd_read_cost.main(["--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["gpu"] for r in rows} == {"H100", "H200"}
    assert {r["loads_per_read"] for r in rows} == {1, 3}
    for row in rows:
        assert 1.0 <= row["us_per_load"] <= 1.25, row


def test_a_bad_file_is_one_line_and_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "2026-userd-fetch-h100.json.xz"
    with lzma.open(bad, "wt") as f:
        json.dump({"reads": -1, "raw_events": events(4, [0, 9])}, f)
    assert userd_read_cost.main([str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reads is -1" in err


def test_loads_per_read_is_what_the_watcher_loads() -> None:
    """userd_fetch.py's constant follows userd_watch.c's watch() loop, word for word."""
    source = (GPU_TOOLS / "userd_watch.c").read_text()
    loop = source[source.index("static void *watch(") : source.index("static void start_watcher")]
    assert len(re.findall(r"\*\(volatile uint64_t \*\)\(userd \+", loop)) == (
        userd_fetch.LOADS_PER_READ
    )
