"""Processes of a cgroup subtree that hold NVIDIA device files, found from /proc.

The probe learns a process's RM clients from its RM_ALLOC traffic, so a process that started before
the probe was loaded is invisible to it: its handles were never seen, and the rm enforcer cannot
stop its channels. This module finds such processes the slow, sure way (``cgroup.procs`` of each
cgroup in a pod's subtree, then the ``/proc/PID/fd`` links of each process) so that the daemon can
say which pods it does not fully enforce, rather than let them run ungoverned in silence.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from qpolicy.nvrm.abi import Node
from qpolicy.runtime.dirtree import directories


def cgroup_procs(root: Path, cgroup: str) -> Iterator[list[int]]:
    """The pids of each cgroup in cgroup ``cgroup`` (a path below the cgroup2 mount ``root``) and
    below it, a list a cgroup, empty ones too: a caller can stop between any two, and a tenant's
    subtree may hold thousands (qpolicy.enforcers.rm.unseen looks in slices)."""
    top = root / cgroup.lstrip("/")
    for directory in directories(str(top)):
        try:
            text = Path(directory, "cgroup.procs").read_text()
        except OSError:
            yield []  # removed while we walked, or not a cgroup
            continue
        yield [int(line) for line in text.split() if line.isdigit()]


def nvidia_files(pid: int, proc: Path = Path("/proc")) -> dict[int, Node]:
    """``pid``'s open NVIDIA device files, fd -> which (gone or unreadable: none)."""
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return {}
    files: dict[int, Node] = {}
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("/dev/nvidia") and name.isdigit():
            files[int(name)] = Node.of_path(target)
    return files


def holds_rm_files(files: Mapping[int, Node]) -> bool:
    """Whether any of ``files`` (fd -> which, as :func:`nvidia_files` gives them) can carry RM
    clients: /dev/nvidiactl and /dev/nvidiaN do; nvidia-uvm and nvidia-caps do not."""
    return any(node in (Node.CTL, Node.GPU) for node in files.values())


def uses_nvidia(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` holds an NVIDIA device file open (gone or unreadable: no)."""
    return holds_rm_files(nvidia_files(pid, proc))


def maps_libcuda(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` has libcuda mapped (gone or unreadable: no): a process without it has no
    CUDA context, and no channels CUDA made (NVML's tools hold device files and none)."""
    try:
        with (proc / str(pid) / "maps").open("rb") as maps:
            return any(b"/libcuda.so" in line for line in maps)
    except OSError:
        return False


#: The MPS server's executable (NVIDIA's MPS guide: nvidia-cuda-mps-control starts it for the
#: first client). /proc/PID/comm would not tell it from the control daemon: both are cut to 15
#: characters, "nvidia-cuda-mps".
MPS_SERVER = "nvidia-cuda-mps-server"


def is_mps_server(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` runs NVIDIA's MPS server (gone or unreadable: no)."""
    try:
        return os.path.basename(os.readlink(proc / str(pid) / "exe")) == MPS_SERVER
    except OSError:
        return False
