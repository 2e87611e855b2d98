"""An MPS server of the doctor's own, for its comparison phase.

MPS is not a lever qpolicy sets: it is what an operator could run instead (or, for an offline pod
of several processes, inside the pod: README). Whether it helps depends on the trainer's kernels:
an online request under MPS waits for the trainer's running kernel, under time-slicing for a
context switch (BENCHMARKS.md, 2026-11-27: solo latency next to 24 µs kernels, worse than the
timeslice lever next to 1.4 ms ones). So the doctor measures it on the node's GPU beside the levers.

The server is private to the run: its pipe and log directories are a fresh temporary directory,
so no other process on the node connects to it, and an MPS server the node already runs (on the
default directories) is left alone. The control daemon is told to quit when the phase ends, and
the directory goes once no process of that server is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qpolicy.errors import QPolicyError

MPS_CONTROL = "nvidia-cuda-mps-control"
PIPE, LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"


def server_pids(pipe_dir: str, proc: Path = Path("/proc")) -> list[int]:
    """The MPS processes (control daemon, server) started with ``pipe_dir`` as their pipe
    directory: the ones this run started, not a server the node runs on other directories."""
    wanted = f"{PIPE}={pipe_dir}".encode()
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            if not comm.startswith("nvidia-cuda-mps"):
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if wanted in environ:
            pids.append(int(entry.name))
    return sorted(pids)


@contextmanager
def mps_server(
    control: str = MPS_CONTROL, quit_timeout_s: float = 20.0
) -> Iterator[dict[str, str]]:
    """Start a private MPS control daemon; yields the environment its clients need."""
    path = shutil.which(control)
    if path is None:
        raise QPolicyError(f"{control} is not on PATH: the MPS comparison needs the CUDA MPS tools")
    root = Path(tempfile.mkdtemp(prefix="qpolicy-doctor-mps."))
    dirs = {PIPE: str(root / "pipe"), LOG: str(root / "log")}
    for directory in dirs.values():
        Path(directory).mkdir()
    env = {**os.environ, **dirs}
    try:
        started = subprocess.run(
            [path, "-d"], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        if started.returncode != 0:
            raise QPolicyError(
                f"{control} -d exited with {started.returncode}: "
                f"{(started.stderr or started.stdout).strip()[-300:]}"
            )
        try:
            yield dirs
        finally:
            subprocess.run(
                [path], input="quit\n", env=env, capture_output=True, text=True, timeout=30,
                check=False,
            )  # fmt: skip
            deadline = time.monotonic() + quit_timeout_s
            while server_pids(dirs[PIPE]) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = server_pids(dirs[PIPE])
            if left:
                raise QPolicyError(
                    f"the doctor's MPS server did not quit within {quit_timeout_s:g} s "
                    f"(pids {', '.join(map(str, left))}, pipe directory {dirs[PIPE]})"
                )
    finally:
        if not server_pids(dirs[PIPE]):
            shutil.rmtree(root, ignore_errors=True)
