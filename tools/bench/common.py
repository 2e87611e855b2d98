"""What every benchmark records about where and when it ran."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
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


class SimClock:
    """A simulated clock the bench moves itself (the daemon's ticks), from 1000 s."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def tmpfs_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory on tmpfs where there is one: a tree's reads are then the kernel's
    dentry work, as on cgroupfs, not the disk's."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix=prefix, dir=shm if shm.is_dir() else None) as tmp:
        yield Path(tmp)
