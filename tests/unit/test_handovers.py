"""tools/gpu/handovers.py on the bench results kept from GPU runs: the hand-over rates
BENCHMARKS.md quotes for the 10-pod daemon rows come out of the pods' own timelines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.gpu import handovers

RESULTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "results"


def rows(name: str) -> dict[str, dict[str, object]]:
    found = {}
    for member, document in handovers.documents(RESULTS / name):
        for row in handovers.rows(member, document):
            found[Path(member).name] = row
    return found


def test_the_h200s_daemon_runs_hand_over_about_as_often_as_400_ms_turns_allow() -> None:
    """Call 26D (H200, ten busy pods, 30 s windows): nine hand-overs per 4 s period in steady
    state, 68 in 30 s, and a few more where a period of 10 ms turns followed a plan change."""
    found = rows("2026-12-02-daemon-cpu-batch-reader-vs-a40789d-h200-call26D.tar.xz")
    assert {name: row["handovers"] for name, row in found.items()} == {
        "daemon-a1.json": 84,
        "daemon-a2.json": 68,
        "daemon-b1.json": 77,
        "daemon-b2.json": 68,
    }
    assert found["daemon-a2.json"]["per_s"] == pytest.approx(68 / 30)


def test_the_profiled_run_handed_over_like_the_others_in_its_window() -> None:
    """Call 26C's 41 periods and 320 turns were the daemon's whole life (76 s, the pods' start
    and exit in it); in the pods' 60 s window the GPU passed between them 149 times."""
    found = rows("2026-12-02-daemon-loop-cpu-by-function-h200-call26C.tar.xz")
    assert found["daemon-f.json"]["handovers"] == 149
    assert found["daemon-f.json"]["window_s"] == 60.0


def test_the_command_line_prints_one_line_a_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = RESULTS / "2026-12-02-guard-pipe-kills-and-daemon-cpu-sampled-h200-call26A.tar.xz"
    assert handovers.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert "r/daemon-a2.json: daemon CPU, 10 pods: 30 s, handed over 68 (2.27/s)" in lines[1]
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert handovers.main([str(broken)]) == 1
    assert "cannot read" in capsys.readouterr().err
    plain = tmp_path / "none.json"
    plain.write_text(json.dumps({"scenarios": {"online 4096": []}}))
    assert handovers.main([str(plain), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
