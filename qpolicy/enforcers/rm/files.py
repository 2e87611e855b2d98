"""Descriptors taken from tenants with ``pidfd_getfd``, held no longer than the tenant holds them.

A borrowed ``/dev/nvidiactl`` descriptor is the same open file as the tenant's: while it is open,
the tenant's RM clients (and their GPU memory) stay alive even after the tenant closed its own copy
or exited. So every borrowed descriptor is tied to what it came from:

* **the process**, by a pidfd taken when the first descriptor is borrowed. A pidfd names one process
  for ever (a pid can be reused), and polls readable once that process has exited: exits are seen
  without the probe's exit events, which can be lost when its buffer overflows;
* **the tenant's descriptor**, by ``kcmp(KCMP_FILE)``: if the tenant closed fd 8 and opened
  something else as fd 8, the borrowed copy is the old file and is closed, not used.

:meth:`BorrowedFiles.reconcile` runs once a second and closes whatever lost its origin; a lookup
checks its one descriptor before handing it out.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import select
import threading
from dataclasses import dataclass, field

from qpolicy.nvrm import rmctl

# kcmp(2) by architecture (x86_64 has its own table; arm64 and riscv use the generic one).
_SYS_KCMP = {"x86_64": 312, "aarch64": 272, "riscv64": 272}.get(platform.machine())
KCMP_FILE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def same_file(pid: int, fd: int, mine: int) -> bool | None:
    """Whether ``pid``'s ``fd`` is still the open file ``mine`` is a copy of.

    None where the kernel cannot tell (no kcmp: CONFIG_KCMP off, or refused); callers then rely on
    the process's exit alone.
    """
    if _SYS_KCMP is None:
        return None
    result = _libc.syscall(_SYS_KCMP, os.getpid(), pid, KCMP_FILE, mine, fd)
    if result == 0:
        return True
    if result > 0:
        return False
    err = ctypes.get_errno()
    if err == errno.EBADF:
        return False  # the tenant's fd is closed
    return None


@dataclass
class _Process:
    pid: int
    pidfd: int
    fds: dict[int, int] = field(default_factory=dict)  # tenant fd -> borrowed copy


class BorrowedFiles:
    """Borrowed descriptors per process, safe to use from the loop and the control thread."""

    def __init__(self) -> None:
        self._procs: dict[int, _Process] = {}
        self._lock = threading.Lock()
        self.closed_stale = 0  # copies closed because the tenant's fd became another file
        self.closed_exited = 0  # copies closed because their process exited

    def get(self, pid: int, fd: int) -> int:
        """A descriptor of this process for ``pid``'s ``fd``; raises RmError if there is none."""
        with self._lock:
            proc = self._procs.get(pid)
            if proc is not None and _exited(proc.pidfd):
                self._drop(proc, exited=True)
                proc = None
            if proc is None:
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError as error:
                    raise rmctl.RmError(f"cannot open process {pid}: {error.strerror}") from None
                proc = self._procs[pid] = _Process(pid, pidfd)
            mine = proc.fds.get(fd)
            if mine is not None and same_file(pid, fd, mine) is False:
                os.close(proc.fds.pop(fd))
                self.closed_stale += 1
                mine = None
            if mine is None:
                mine = proc.fds[fd] = rmctl.borrow_fd_from(proc.pidfd, pid, fd)
            return mine

    def reconcile(self) -> list[int]:
        """Close what lost its origin: every descriptor of a process that exited, and each copy
        whose tenant fd became another file. Returns the pids found exited."""
        exited: list[int] = []
        with self._lock:
            for proc in list(self._procs.values()):
                if _exited(proc.pidfd):
                    exited.append(proc.pid)
                    self._drop(proc, exited=True)
                    continue
                for fd, mine in list(proc.fds.items()):
                    if same_file(proc.pid, fd, mine) is False:
                        os.close(proc.fds.pop(fd))
                        self.closed_stale += 1
        return exited

    def forget(self, pid: int) -> None:
        """The probe saw ``pid`` exit: let go of its descriptors now."""
        with self._lock:
            proc = self._procs.get(pid)
            if proc is not None:
                self._drop(proc, exited=True)

    def close_all(self) -> None:
        with self._lock:
            for proc in list(self._procs.values()):
                self._drop(proc, exited=False)

    def _drop(self, proc: _Process, *, exited: bool) -> None:
        for mine in proc.fds.values():
            os.close(mine)
        if exited:
            self.closed_exited += len(proc.fds)
        os.close(proc.pidfd)
        del self._procs[proc.pid]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(proc.fds) for proc in self._procs.values())

    def processes(self) -> list[int]:
        with self._lock:
            return sorted(self._procs)


def _exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))
