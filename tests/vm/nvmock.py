"""nvmock as the VM tier's tests and tenants see it: where it lives, its module parameters and
debugfs tables, loading it and making the device nodes.

Kept apart from conftest.py so that the tenant processes the tests start import it without
pytest: under the VM's TCG, importing pytest took about 5 s of each tenant's start (2026-12-07).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qpolicy.nvrm import abi
from qpolicy.telemetry.devices import PROC_DEVICES, char_majors

ROOT = Path(__file__).resolve().parents[2]
NVMOCK = ROOT / "kmod" / "nvmock" / "nvmock.ko"
GPULOAD = ROOT / "tools" / "gpuload" / "gpuload"
DEBUGFS = Path("/sys/kernel/debug/nvmock")
NVMOCK_PARAMS = Path("/sys/module/nvmock/parameters")
GPUS = 2
BAD_KERNEL_LOG = re.compile(
    r"WARNING:|BUG:|Oops|general protection|Call Trace|kmemleak|nvidia.ko would fault"
)


def objects() -> dict[str, int]:
    counts = {}
    for line in (DEBUGFS / "objects").read_text().splitlines():
        name, value = line.split()
        counts[name] = int(value)
    return counts


def processes(gpu: int = 0) -> dict[int, int]:
    """GPU time in ns per process id, from the engine's ground truth."""
    out = {}
    for line in (DEBUGFS / f"gpu{gpu}" / "processes").read_text().splitlines():
        pid, ns = line.split()
        out[int(pid)] = int(ns)
    return out


def read_nvmock_param(name: str) -> int:
    """The loaded nvmock's module parameter ``name``."""
    return int((NVMOCK_PARAMS / name).read_text())


@contextmanager
def nvmock_param(name: str, value: int) -> Iterator[None]:
    """nvmock's module parameter ``name`` set to ``value`` for the block."""
    param = NVMOCK_PARAMS / name
    before = param.read_text().strip()
    param.write_text(str(value))
    try:
        yield
    finally:
        param.write_text(before)


def read_counts(path: Path) -> dict[str, int]:
    """A file of "name value" lines (nvmock's debugfs counts, a cgroup's memory.events)."""
    text = path.read_text()
    return {key: int(value) for key, value, *_ in (line.split() for line in text.splitlines())}


def debugfs_rows(gpu: int, table: str, first: str) -> list[dict[str, int]]:
    """A dict a line of debugfs gpuN/``table``, whose lines are a number (named ``first``) and
    then name value pairs."""
    rows = []
    for line in (DEBUGFS / f"gpu{gpu}" / table).read_text().splitlines():
        words = line.split()
        named = zip(words[1::2], words[2::2], strict=True)
        rows.append({first: int(words[0]), **{key: int(value) for key, value in named}})
    return rows


def channel_rows(gpu: int = 0) -> list[dict[str, int]]:
    """nvmock's channels, a dict a line of debugfs gpuN/channels: chid and its named fields."""
    return debugfs_rows(gpu, "channels", "chid")


def tsg_rows(gpu: int = 0) -> list[dict[str, int]]:
    """nvmock's TSGs, a dict a line of debugfs gpuN/tsgs: id and its named fields (pid,
    timeslice_us, interleave, gpu_ns, channels, compute_preemption)."""
    return debugfs_rows(gpu, "tsgs", "id")


def engine_account(gpu: int = 0) -> dict[str, int]:
    """The engine's own totals since the last reset: switches, switch_ns, busy_ns, and switches
    by overshoot past switch_us (switch_over_10us, _100us, _1ms, _more)."""
    return read_counts(DEBUGFS / f"gpu{gpu}" / "engine")


def reset(gpu: int = 0) -> None:
    (DEBUGFS / f"gpu{gpu}" / "reset").write_text("1")


def kernel_log() -> str:
    return subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout


def load(**params: int) -> None:
    args = [f"{key}={value}" for key, value in params.items()]
    subprocess.run(["insmod", str(NVMOCK), *args], check=True)


def unload() -> None:
    subprocess.run(["rmmod", "nvmock"], check=True)


def threads_named(prefix: str) -> list[int]:
    """Ids of the tasks whose name starts with ``prefix``: kernel threads such as nvmock's engine
    (nvmock-gpuN) and qgpu's schedulers (qgpu/gpuN). One that ends while being looked at is
    left out."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().startswith(prefix):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def uvm_major() -> int:
    """/dev/nvidia-uvm's major: dynamic, as nvidia-modprobe finds it, in /proc/devices."""
    return char_majors(PROC_DEVICES.read_text())[abi.UVM_DEVICE_NAME]


def make_nodes(gpus: int = GPUS) -> None:
    nodes = [("nvidiactl", 195, 255)] + [(f"nvidia{i}", 195, i) for i in range(gpus)]
    for name, major, minor in [*nodes, ("nvidia-uvm", uvm_major(), 0)]:
        path = Path("/dev") / name
        if path.exists() and path.stat().st_rdev != os.makedev(major, minor):
            path.unlink()  # a node of an earlier load, whose dynamic major was another
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
