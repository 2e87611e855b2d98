"""tools/gpu/steal_tails.py: an online row's slow requests against the host's steal samples."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from tools.gpu import steal_tails
from tools.gpu.steal_tails import BadInput, splits

RESULTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "results"
START = 1_000.0


def noise(steal_in: set[int], samples: int = 40) -> dict[str, Any]:
    """Quarter-second samples from START; steal in the samples numbered in ``steal_in``."""
    rows = [
        {"t": 0.25 * (k + 1), "steal": 0.0025 if k in steal_in else 0.0, "busy": 0.01}
        for k in range(samples)
    ]
    return {"start": START, "interval_s": 0.25, "samples": rows}


def bench(latencies: list[float], wall_start: float = START + 1.0) -> dict[str, Any]:
    mode = {
        "mode": "qpolicy",
        "pods": {"online": {"latencies_ms": latencies}, "trainer": {"wall_start": wall_start}},
    }
    return {"scenarios": {"row": [mode, {"mode": "solo", "pods": {}}]}}


def test_slow_requests_are_counted_on_the_side_of_their_arrival() -> None:
    # 150 requests from START + 1 s: request i arrives at 1 + i / 150 s, in sample
    # int((1 + i / 150) / 0.25). Samples 4-7 hold the first second of requests.
    latencies = [0.5] * 150
    for i in (10, 20, 100):  # 1.07, 1.13 s (sample 4) and 1.67 s (sample 6)
        latencies[i] = 2.0
    latencies[140] = 3.0  # 1.93 s: sample 7
    (row,) = splits(bench(latencies), noise({4}), slow_x=1.5)
    assert row.mode == "qpolicy" and row.slow_above_ms == pytest.approx(0.75)
    # Sample 4 (1.0-1.25 s] holds requests 1..37 (request 0 at exactly 1.0 s is sample 3's end).
    assert (row.slow_with_steal, row.with_steal) == (2, 37)
    assert (row.slow_without_steal, row.without_steal) == (2, 113)
    assert row.rate_with == pytest.approx(2 / 37)


def test_requests_outside_the_sampled_time_are_left_out() -> None:
    row = splits(bench([0.5] * 150, wall_start=START + 9.5), noise(set()), slow_x=1.5)[0]
    assert row.with_steal + row.without_steal == 76  # 9.5-10.0 s sampled, then none
    assert row.rate_with is None


@pytest.mark.parametrize(
    ("bench_data", "noise_data", "words"),
    [
        ({"scenarios": {}}, noise(set()), "no scenarios"),
        ({"scenarios": {"row": [{"mode": "solo", "pods": {}}]}}, noise(set()), "no online row"),
        (bench([]), noise(set()), "no online latencies"),
        (bench([0.5]), {"start": START, "interval_s": 0.25, "samples": []}, "no samples"),
        (bench([0.5]), {"samples": [{"t": 1}]}, "no start"),
        (bench([0.5]), {"start": 0, "interval_s": 0.25, "samples": [{"x": 1}]}, "without a time"),
    ],
)
def test_what_cannot_be_read_is_named(
    bench_data: dict[str, Any], noise_data: dict[str, Any], words: str
) -> None:
    with pytest.raises(BadInput, match=words):
        splits(bench_data, noise_data, slow_x=1.5)


def test_the_h200_runs_whose_p99_missed_had_their_slow_requests_where_steal_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """BENCHMARKS.md, thirty-ninth session: in 39C's two runs (p99 1.69 and 2.34 x solo) the
    qpolicy stream's slow requests were 4-13 times as frequent in samples with steal."""
    for run in ("39C1", "39C2"):
        bench_file = RESULTS / f"2026-12-05-bench-gpu-online-8192-84c44ef-h200-call{run}.json.xz"
        noise_file = RESULTS / "2026-12-05-host-noise-h200-call39C.json.xz"
        assert steal_tails.main(["--json", str(bench_file), str(noise_file)]) == 0
        rows = {r["mode"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
        q = rows["qpolicy"]
        assert q["with_steal"] > 300 and q["without_steal"] > 2000
        assert q["rate_with"] > 3 * q["rate_without"], q


def test_bad_input_is_one_line_and_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench_file, noise_file = tmp_path / "b.json.xz", tmp_path / "n.json"
    with lzma.open(bench_file, "wt") as f:
        json.dump({"scenarios": {}}, f)
    noise_file.write_text(json.dumps(noise(set())))
    assert steal_tails.main([str(bench_file), str(noise_file)]) == 1
    assert capsys.readouterr().err.strip() == "steal_tails: bench: no scenarios"
    assert steal_tails.main(["--slow-x", "0", str(bench_file), str(noise_file)]) == 2
    assert "--slow-x must be positive, not 0.0" in capsys.readouterr().err


def own_samples(steal_in: set[int], samples: int = 40) -> dict[str, Any]:
    """A bench run's own steal samples (tools/gpu/host_noise.StealWatch.within), as noise()."""
    raw = [[START + 0.25 * (k + 1), 1 if k in steal_in else 0] for k in range(samples)]
    return {"interval_s": 0.25, "samples": samples, "with_steal": len(steal_in), "raw": raw}


def test_without_a_sampler_each_run_is_split_by_its_own_samples() -> None:
    latencies = [0.5] * 150
    for i in (10, 20, 100):
        latencies[i] = 2.0
    latencies[140] = 3.0
    data = bench(latencies)
    data["scenarios"]["row"][0]["host_steal"] = own_samples({4})
    # The same requests and samples as the sampler's test above, the same split.
    (row,) = splits(data, None, slow_x=1.5)
    assert (row.slow_with_steal, row.with_steal) == (2, 37)
    assert (row.slow_without_steal, row.without_steal) == (2, 113)
    # Another run of the row with steal elsewhere is split by its own samples, not the first's.
    other = bench(latencies)["scenarios"]["row"][0] | {"mode": "native"}
    other["host_steal"] = own_samples({6})
    data["scenarios"]["row"].append(other)
    rows = {r.mode: r for r in splits(data, None, slow_x=1.5)}
    assert (rows["native"].slow_with_steal, rows["native"].with_steal) == (1, 37)


@pytest.mark.parametrize(
    ("steal", "words"),
    [
        (None, "no steal samples of its own"),
        ({"interval_s": 0.25, "raw": []}, "no steal samples of its own"),
        ({"interval_s": 0.25, "raw": [[1.0]]}, r"not \[end, ticks\]"),
    ],
)
def test_a_run_without_its_own_samples_is_named(steal: Any, words: str) -> None:
    data = bench([0.5])
    if steal is not None:
        data["scenarios"]["row"][0]["host_steal"] = steal
    with pytest.raises(BadInput, match=words):
        splits(data, None, slow_x=1.5)


def test_the_h100s_first_run_of_the_benchs_own_sampling_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Call 41A (H100, 2026-12-05): native's 8192 row, 6 s, split by the samples it kept."""
    bench_file = RESULTS / "2026-12-05-bench-gpu-steal-smoke-16cf467-h100-call41A.json.xz"
    assert steal_tails.main(["--json", str(bench_file)]) == 0
    (row,) = map(json.loads, capsys.readouterr().out.splitlines())
    assert row["mode"] == "native"
    assert row["with_steal"] + row["without_steal"] >= 850  # 901 requests, 6 s sampled
    assert row["with_steal"] > 0
