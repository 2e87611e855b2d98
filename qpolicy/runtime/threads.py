"""Daemon threads the kernel can tell apart.

Python before 3.14 leaves every thread with the process's name (``python3``) in
``/proc/PID/task/TID/comm``, so ``top -H``, ``ps -L`` and a per-thread CPU reading cannot say
whether the daemon's CPU goes to its loop, its control worker (whose RM controls spin in the
kernel while GSP answers) or its metrics server. :class:`NamedThread` gives each of its threads
the kernel name ``qp-<role>`` as it starts; the main thread (the loop) keeps the process's name.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any

# prctl(2): PR_SET_NAME names the calling thread; the kernel keeps 15 bytes of it.
PR_SET_NAME = 15
TASK_COMM_LEN = 16
PREFIX = "qp-"


def kernel_name(name: str) -> bytes:
    """``qpolicy-controls`` → ``qp-controls``, cut to what the kernel keeps."""
    short = PREFIX + name.removeprefix("qpolicy-")
    return short.encode("ascii", "replace")[: TASK_COMM_LEN - 1]


@functools.cache
def _prctl() -> Callable[..., int] | None:
    # The process's own symbols, libc's among them: no library search (find_library runs
    # ldconfig), once per process.
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def name_this_thread(name: str) -> bool:
    """Give the calling thread the kernel name of ``name``; False where prctl is not there or
    refuses (a name is a help to the operator, never a reason to fail)."""
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(PR_SET_NAME, ctypes.c_char_p(kernel_name(name)), 0, 0, 0) == 0


class NamedThread(threading.Thread):
    """A daemon thread that names itself to the kernel (:func:`kernel_name`) as it starts."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        super().__init__(target=target, name=name, daemon=True)

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()
