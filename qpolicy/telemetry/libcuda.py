"""Finding libcuda and the entry points that launch GPU work, for the probe's uprobes.

Kernel launches issue no ioctl on Volta and later (usermode doorbell), so activity is counted
where CUDA enters the driver library. A uprobe is on the library file itself (its inode), so one
attached to the host's libcuda also counts processes in containers that bind-mount that file,
as the NVIDIA container toolkit does.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from qpolicy.errors import ValidationError

# cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel(MultiDevice), cuGraphLaunch, each
# also as the per-thread-default-stream _ptsz variant.
LAUNCH_SYMBOLS = re.compile(
    r"^(cuLaunchKernel(Ex)?|cuLaunchCooperativeKernel(MultiDevice)?|cuGraphLaunch)(_ptsz)?$"
)
COMMON_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",  # GPU operator / device plugin hosts
    "/usr/local/cuda/compat/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
)


def _ldconfig_paths() -> list[str]:
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, check=False, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    entries = []
    for line in out.splitlines():
        name, sep, target = line.strip().partition(" => ")
        if sep and name.startswith("libcuda.so"):
            # The 64-bit libcuda.so.1 first: what the loader gives a CUDA program here.
            entries.append(("x86-64" not in name, name.split()[0] != "libcuda.so.1", target))
    return [target.strip() for *_, target in sorted(entries)]


def find_libcuda(spec: str | Path | None) -> Path | None:
    """The library to probe: None disables, "auto" searches, anything else is a path."""
    if spec is None:
        return None
    if str(spec) != "auto":
        path = Path(spec)
        if not path.is_file():
            raise ValidationError(f"libcuda {str(path)!r} is not a file")
        return path.resolve()
    for candidate in (*_ldconfig_paths(), *COMMON_PATHS):
        path = Path(candidate)
        if path.is_file():
            return path.resolve()
    return None
