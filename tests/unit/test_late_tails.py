"""tools/gpu/late_tails.py: an online stream's slow requests split into those its host issued late
and those the GPU held, on made-up streams and on the kept H100 runs of calls 42C and 42D."""

from __future__ import annotations

import json
import lzma
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tools.bench import gpu
from tools.gpu import late_tails

RESULTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "results"


def stream(latencies: list[float], late: list[float], label: str = "s") -> dict[str, Any]:
    return {"latencies_ms": latencies, "late_ms": late, "label": label}


def test_a_slow_request_is_issued_late_where_its_lateness_is_half_its_excess_or_more() -> None:
    """Ten requests at 0.4 ms, 0.1 ms of it lateness. Two are slow (over 0.6 ms): one woken
    1.0 ms late (the host), one issued on time and held 1.1 ms (the GPU)."""
    latencies = [0.4] * 8 + [1.4, 1.5]
    late = [0.1] * 8 + [1.1, 0.1]
    t = late_tails.tail("f", "s", stream(latencies, late), 1.5)
    assert (t.requests, t.slow, t.slow_issued_late) == (10, 2, 1)
    assert (t.p50_ms, t.p99_ms) == (0.4, 1.5)
    # Issue to done: 0.3 ms for all but the one the GPU held (1.4 ms).
    assert t.issued_p50_ms == pytest.approx(0.3) and t.issued_p99_ms == pytest.approx(1.4)
    assert (t.late_p50_ms, t.late_p99_ms) == (0.1, 1.1)


def test_the_bench_json_gives_its_solos_and_each_modes_online_stream() -> None:
    bench = {
        "online_solo": stream([0.4] * 4, [0.1] * 4),
        "online_solo_after": stream([0.5] * 4, [0.1] * 4),
        "scenarios": {
            "row": [
                {"mode": "native", "pods": {"online": stream([1.0] * 4, [0.1] * 4), "trainer": {}}},
                {"mode": "qpolicy", "pods": {"online": stream([0.6] * 4, [0.1] * 4)}},
                {"mode": "shares", "pods": {"p0": {}}},  # no online stream: not a row here
            ]
        },
    }
    runs = [run for run, _ in late_tails.streams(bench)]
    assert runs == ["solo before", "solo after", "row, native", "row, qpolicy"]
    assert [run for run, _ in late_tails.streams(stream([0.4], [0.1], "solo-on-4"))] == [
        "solo-on-4"
    ]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"latencies_ms": [0.4, 0.5]}, "no late_ms (a stream from before 2bbd6de?)"),
        (stream([0.4, 0.5], [0.1]), "1 late_ms for 2 latencies"),
        (stream([0.4, "x"], [0.1, 0.1]), "not a number"),
        ({"scenarios": {"row": [{"mode": "native", "pods": {}}]}}, "no online stream"),
    ],
)
def test_a_file_that_is_not_a_stream_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any], said: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    assert late_tails.main([str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("late_tails: ") and said in err and "run.json" in err
    assert "\n" not in err


def test_bad_arguments_and_unreadable_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(stream([0.4], [0.1])))
    assert late_tails.main(["--slow-x", "0", str(path)]) == 2
    assert "--slow-x must be positive, not 0.0" in capsys.readouterr().err
    (tmp_path / "broken.json").write_text("{")
    assert late_tails.main([str(tmp_path / "broken.json")]) == 1
    assert "broken.json" in capsys.readouterr().err


def _kept_solo(member: str) -> dict[str, Any]:
    with tarfile.open(RESULTS / "2026-12-05-solo-smi-h100-call42C2.tar") as tar:
        handle = tar.extractfile(member)
        assert handle is not None
        data = json.loads(lzma.decompress(handle.read()))
    assert isinstance(data, dict)
    return data


def test_the_unstable_h100_solo_of_call_42c_was_its_host_issuing_late() -> None:
    """Solo off-5 (no nvidia-smi beside it): p99 1.38 ms over its p50 0.41, unstable; 68 of its
    75 slow requests were issued late, and issue to done its p99 is 0.39 ms."""
    t = late_tails.tail("42C2", "off-5", _kept_solo("solo-42c-off-5.json.xz"), 1.5)
    assert (t.requests, t.slow, t.slow_issued_late) == (3001, 75, 68)
    assert t.p99_ms == pytest.approx(1.378, abs=1e-3)
    assert t.issued_p99_ms == pytest.approx(0.392, abs=1e-3)


def test_the_kept_h100_row_of_call_42d(capsys: pytest.CaptureFixture[str]) -> None:
    path = RESULTS / "2026-12-05-bench-gpu-online-8192-2bbd6de-h100-call42D.json.xz"
    rows = {t.run: t for t in late_tails.tails(path, 1.5)}
    qpolicy = rows["online 4096 @ 150 Hz next to an offline 8192 trainer, qpolicy"]
    assert qpolicy.p99_ms == pytest.approx(0.737, abs=1e-3)
    assert qpolicy.issued_p99_ms == pytest.approx(0.621, abs=1e-3)
    assert (qpolicy.slow, rows["solo before"].slow) == (3, 4)
    assert late_tails.main(["--json", str(path)]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 5 and out[0]["run"] == "solo before"


def test_the_bench_says_how_many_of_an_unstable_solos_slow_requests_were_issued_late() -> None:
    unstable = {**_kept_solo("solo-42c-off-5.json.xz")}
    stable = {**_kept_solo("solo-42c-on-5.json.xz")}
    lines = gpu.solo_lines({"online_solo": unstable, "online_solo_after": stable})
    assert lines[1].endswith(", unstable, 68 of its 75 slow requests issued late by the host")
    assert lines[2] == "online solo after them: p50 0.37 / p99 0.47 ms (3001)"
    # A solo from before late_ms: its line as before.
    del unstable["late_ms"]
    assert gpu.solo_lines({"online_solo": unstable})[1].endswith("(3001), unstable")


@pytest.mark.parametrize(
    ("paths", "shown"),
    [
        (["a/rows-43B/8192/bench.json", "a/rows-43C/8192/bench.json"],
         ["rows-43B/8192/bench.json", "rows-43C/8192/bench.json"]),
        (["x/run1.json", "y/run2.json"], ["run1.json", "run2.json"]),
        (["x/run.json", "x/run.json"], ["run.json", "run.json"]),  # one file twice: its name
        (["run.json", "sub/run.json"], ["run.json", "sub/run.json"]),
    ],
)  # fmt: skip
def test_files_of_one_name_are_told_apart_by_their_folders(
    paths: list[str], shown: list[str]
) -> None:
    assert late_tails.labels([Path(p) for p in paths]) == shown


def test_the_table_names_each_rows_file_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The device's tars hold one bench.json per row; the table tells them apart."""
    for row in ("8192", "2048"):
        (tmp_path / row).mkdir()
        (tmp_path / row / "bench.json").write_text(json.dumps(stream([0.4] * 4, [0.1] * 4, row)))
    files = [str(tmp_path / row / "bench.json") for row in ("8192", "2048")]
    assert late_tails.main(files) == 0
    out = capsys.readouterr().out
    assert "| 8192/bench.json | 8192 |" in out and "| 2048/bench.json | 2048 |" in out, out
