"""What anyone may read of qgpu.ko under /sys/kernel/qgpu (no capability needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SYSFS_ROOT = Path("/sys/kernel/qgpu")
# The module's parameters (read-only ones included), where the kernel puts every module's.
PARAMS_ROOT = Path("/sys/module/qgpu/parameters")


@dataclass(frozen=True, slots=True)
class SysfsGpu:
    index: int
    policy: str | None
    period_us: int | None
    nr_periods: int | None
    online_busy: bool | None
    offline_timeslice_us: int | None = None
    online_timeslice_us: int | None = None
    # The compute preemption mode set on offline contexts given their class's timeslice:
    # "own" or "cta" (kmod/uapi/qgpu.h)
    offline_preemption: str | None = None
    # Scheduler passes that looked at the GPU's channels, and the USERD reads they made (each a
    # PCIe read on a GPU; a channel idle for a second is read only every cold_look_us, one
    # fed only in its first second every dormant_look_us)
    passes: int | None = None
    userd_reads: int | None = None


@dataclass(frozen=True, slots=True)
class SysfsInfo:
    """What anyone may read of the module under /sys/kernel/qgpu (None: a file is missing)."""

    version: int | None
    target: str | None
    hooked: bool | None
    cgroups: int | None
    gpus: tuple[SysfsGpu, ...]
    # nvidia-uvm's mmap hooked: managed memory is refused to memory-limited cgroups
    uvm_hooked: bool | None = None
    # Which offline cgroups close for online work: 0 none, 1 those the class timeslice does not
    # preempt (several CUDA contexts), 2 all (kmod/qgpu/sched.c)
    online_gate: int | None = None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _read_bool(path: Path) -> bool | None:
    value = _read_int(path)
    return None if value is None else value != 0


def read_sysfs(root: Path = SYSFS_ROOT, params: Path = PARAMS_ROOT) -> SysfsInfo:
    gpus = []
    for directory in root.glob("gpu*"):
        suffix = directory.name.removeprefix("gpu")
        if not (suffix.isdigit() and directory.is_dir()):
            continue
        gpus.append(
            SysfsGpu(
                index=int(suffix),
                policy=_read(directory / "policy"),
                period_us=_read_int(directory / "period_us"),
                nr_periods=_read_int(directory / "nr_periods"),
                online_busy=_read_bool(directory / "online_busy"),
                offline_timeslice_us=_read_int(directory / "offline_timeslice_us"),
                online_timeslice_us=_read_int(directory / "online_timeslice_us"),
                offline_preemption=_read(directory / "offline_preemption"),
                passes=_read_int(directory / "passes"),
                userd_reads=_read_int(directory / "userd_reads"),
            )
        )
    return SysfsInfo(
        version=_read_int(root / "version"),
        target=_read(root / "target"),
        hooked=_read_bool(root / "hooked"),
        cgroups=_read_int(root / "cgroups"),
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        uvm_hooked=_read_bool(root / "uvm_hooked"),
        online_gate=_read_int(params / "online_gate"),
    )
