"""tools/gpu/row_clocks.py: the GPU's clocks in each mode's run of a bench result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.gpu import row_clocks
from tools.gpu.ab_runs import Sample

RESULTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "results"


def run(mode: str, start: float, seconds: float = 10.0) -> dict[str, Any]:
    pods = {
        "online": {"wall_start": start, "seconds": seconds},
        "trainer": {"wall_start": start + 0.5, "seconds": seconds - 1},
    }
    return {"mode": mode, "pods": pods}


def test_each_mode_is_read_over_its_own_window() -> None:
    # Native 100-110 s at 1 500 MHz, qpolicy 200-210 s at 1 800; samples every second.
    samples = [Sample(float(t), 1500.0 if t < 150 else 1800.0, 700.0, 0x4) for t in range(300)]
    samples.append(Sample(100.5, 100.0, 1.0, 0x4))  # in native's first second: left out
    report = {"scenarios": {"row": [run("native", 100.0), run("qpolicy", 200.0)]}}
    native, qpolicy = row_clocks.row_clocks(report, samples)
    assert native["mode"] == "native" and native["clocks"]["sm_mhz_mean"] == 1500
    assert native["clocks"]["sm_mhz_min"] == 1500  # the sample at 100.5 s was outside
    assert native["clocks"]["samples"] == 9  # 101..109 s
    assert qpolicy["clocks"]["sm_mhz_mean"] == 1800
    assert qpolicy["clocks"]["reasons"] == {"sw_power_cap": 1.0}


def test_a_run_without_starts_or_samples_reads_as_none() -> None:
    report = {"scenarios": {"row": [{"mode": "mps", "pods": {"online": {"error": "x"}}}]}}
    (only,) = row_clocks.row_clocks(report, [Sample(1.0, 1500.0, 700.0, None)])
    assert only["clocks"] == {}
    assert "| row | mps | - | - | 0 | - |" in row_clocks.table([only])


def test_the_h100_runs_of_the_forty_first_session_were_all_at_the_power_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """BENCHMARKS.md, forty-first session: next to the 8192 trainer every mode ran at the
    H100's power cap, 1 462-1 489 MHz on average; the solos' clock (1 980) was not the row's."""
    bench = RESULTS / "2026-12-05-bench-gpu-online-8192-3e4025f-h100-call41B1.json.xz"
    smi = RESULTS / "2026-12-05-smi-h100-call41B1.csv.xz"
    assert row_clocks.main(["--json", str(bench), str(smi)]) == 0
    rows = {r["mode"]: r["clocks"] for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(rows) == {"native", "mps", "qpolicy"}
    for clocks in rows.values():
        assert 1450 <= clocks["sm_mhz_mean"] <= 1500, clocks
        assert clocks["reasons"]["sw_power_cap"] == 1.0
        assert clocks["samples"] >= 70


def test_bad_input_is_one_line_and_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench, smi = tmp_path / "b.json", tmp_path / "smi.csv"
    bench.write_text(json.dumps({"scenarios": {}}))
    smi.write_text("timestamp, clocks.current.sm [MHz], power.draw [W]\n")
    assert row_clocks.main([str(bench), str(smi)]) == 1
    assert capsys.readouterr().err.strip() == "row_clocks: bench: no scenarios"
    smi.write_text("timestamp, utilization.gpu\n")
    assert row_clocks.main([str(bench), str(smi)]) == 1
    assert "no timestamp, clocks.current.sm or power.draw column" in capsys.readouterr().err
    bench.write_text("[1]")
    smi.write_text("timestamp, clocks.current.sm [MHz], power.draw [W]\n")
    assert row_clocks.main([str(bench), str(smi)]) == 1
    assert "not a JSON object" in capsys.readouterr().err
