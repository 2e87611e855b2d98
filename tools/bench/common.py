"""What every benchmark records about where and when it ran."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": commit,
    }


def summary_ms(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[max(int(len(ordered) * 0.99) - 1, 0)]
    return {
        "median_ms": statistics.median(ordered) / 1e6,
        "p99_ms": p99 / 1e6,
        "min_ms": ordered[0] / 1e6,
        "runs": len(ordered),
    }
