"""tools/gpu/probe_cost.py: what it reports from ioctlbench's runs, with and without the probe."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools.gpu import probe_cost


def test_the_cost_is_the_difference_of_the_medians_and_a_failed_run_counts_for_nothing() -> None:
    cost = probe_cost
    without = [
        {"control_ns": 1000.0, "alloc_free_ns": 9000.0},
        {"control_ns": 1200.0, "alloc_free_ns": 9100.0},
        {"control_ns": 1100.0, "alloc_free_ns": 50000.0},
        {"error": ["ioctlbench: RM_ALLOC: Input/output error"]},
    ]
    loaded = [
        {"control_ns": 1500.0, "alloc_free_ns": None, "alloc_free_status": 31},
        {"control_ns": 1300.0},
        {"control_ns": 1400.0},
    ]
    summary = cost.summarise(without, loaded)
    assert summary["control_ns"] == {
        "median_without": 1100.0,
        "median_with": 1400.0,
        "added_ns": 300.0,
        "ratio": pytest.approx(1400 / 1100),
    }
    # No run with the probe measured alloc+free: nothing to compare, nothing reported.
    assert "alloc_free_ns" not in summary and "sysparams_ns" not in summary


def test_a_bench_that_fails_is_reported_with_its_last_line(tmp_path: Path) -> None:
    fake = tmp_path / "ioctlbench"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "print('{\"iterations\": 5, \"control_ns\": 7.0', end='')\n"
        "sys.stderr.write('ioctlbench: RM_ALLOC: Input/output error\\n')\nsys.exit(1)\n"
    )
    fake.chmod(0o755)
    result = probe_cost.bench(str(fake), 5)
    assert result["error"] == ["ioctlbench: RM_ALLOC: Input/output error"]
    assert result["partial"].startswith('{"iterations": 5, "control_ns": 7.0')
    ok = tmp_path / "ok"
    ok.write_text(f'#!{sys.executable}\nprint(\'{{"iterations": 5, "control_ns": 7.5}}\')\n')
    ok.chmod(0o755)
    assert probe_cost.bench(str(ok), 5) == {"iterations": 5, "control_ns": 7.5}


def test_a_result_records_the_host() -> None:
    from tools.gpu.hostinfo import host_facts

    facts = host_facts()
    assert facts["date"].endswith(" UTC") and facts["uname"]
    # This machine has no NVIDIA driver: its line is left out, not invented.
    assert "driver" not in facts or facts["driver"].startswith("NVRM")
