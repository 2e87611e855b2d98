"""tools/gpu/solo-alone.sh (call 42C's runs: the online solo stream alone, without and with
nvidia-smi beside it), run here with the test stand-ins for PyTorch and nvidia-smi: what it
leaves, and the arguments it refuses."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu" / "solo-alone.sh"
FAKE_TORCH = Path(__file__).parent / "fake_torch"


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    # A sampler that says which query it was given, then samples until killed.
    smi.write_text('#!/bin/sh\necho "query: $1"\nexec sleep 600\n')
    smi.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": f"{FAKE_TORCH}:{ROOT}",
    }


def test_it_leaves_each_run_sampled_in_one_tar(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "1", "0.51"],
        env=_env(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "out" / "solo-alone.tar") as tar:
        names = sorted(n.removeprefix("./") for n in tar.getnames() if n not in (".", "./"))
        assert names == [
            "noise-off-1.json.xz", "noise-on-1.json.xz", "smi-on-1.csv.xz",
            "solo-off-1.json.xz", "solo-on-1.json.xz",
        ]  # fmt: skip
        member = tar.extractfile("./solo-on-1.json.xz")
        assert member is not None
        solo = json.loads(lzma.decompress(member.read()))
        smi = tar.extractfile("./smi-on-1.csv.xz")
        assert smi is not None
        assert lzma.decompress(smi.read()).decode().startswith("query: --query-gpu=timestamp,")
    # 150 Hz for 0.51 s (77 arrivals), each request's lateness kept beside its latency.
    assert solo["label"] == "solo-on-1" and solo["requests"] == 77
    assert len(solo["late_ms"]) == len(solo["latencies_ms"]) == 77
    # late_tails read what it left: a row a run.
    rows = [line for line in done.stdout.splitlines() if "| solo-o" in line]
    assert [r.split(" | ")[1] for r in rows] == ["solo-off-1", "solo-on-1"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["0"], "PAIRS must be a positive whole number, not '0'"),
        (["two"], "PAIRS must be a positive whole number, not 'two'"),
        (["1", "0"], "SECONDS must be a number of seconds in (0, 600], not '0'"),
        (["1", "nan"], "SECONDS must be a number of seconds in (0, 600], not 'nan'"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), *args],
        env=_env(tmp_path), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == f"solo-alone: {said}"
    assert not (tmp_path / "out").exists()
