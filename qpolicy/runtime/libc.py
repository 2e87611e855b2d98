"""The C library, loaded once, for the system calls Python's standard library has no binding
for (inotify(7), name_to_handle_at(2)): errno is kept for ``ctypes.get_errno``."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
