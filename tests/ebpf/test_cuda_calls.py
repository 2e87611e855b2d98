"""tools/gpu/cuda_calls.py, the count of libcuda calls a workload makes, on the stand-in libcuda."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_counts_the_calls_of_its_command_by_name_and_nothing_else(
    fake_libcuda: Path, tmp_path: Path
) -> None:
    # A copy of its own: bcc's perf-event uprobes cannot share a function with the session
    # probe's uprobe-multi links (test_probe.py, test_libcudas_uprobes_count_the_same_...).
    copy = tmp_path / "libcuda.so.1"
    shutil.copyfile(fake_libcuda, copy)
    fake_libcuda = copy
    script = (
        "import ctypes\n"
        f"lib = ctypes.CDLL({str(fake_libcuda)!r})\n"
        "for _ in range(7): lib.cuStreamQuery()\n"
        "for _ in range(3): lib.cuLaunchKernelEx()\n"
        "lib.cuLaunchKernelEx_ptsz()\n"  # an alias: the same function, counted under both names
        "lib.cuMemAlloc()\n"  # not in the pattern
    )
    out = tmp_path / "calls.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "gpu" / "cuda_calls.py"),
            "--lib",
            str(fake_libcuda),
            "--out",
            str(out),
            "--",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["calls"] == {"cuStreamQuery": 7, "cuLaunchKernelEx/cuLaunchKernelEx_ptsz": 4}
    assert result["exit"] == 0
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result
