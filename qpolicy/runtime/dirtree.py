"""Directory trees walked with a stack of their own, not the interpreter's.

Python 3.11's os.walk recurses a generator frame per level: a tree deeper than the recursion
limit (about 1 000) raises RecursionError. The trees walked here are cgroup hierarchies, and a
tenant given a delegated subtree chooses its depth (``cgroup.max.depth`` is "max" unless an
ancestor sets it): a chain of 1 200 cgroups raised from the walks of the daemon's loop thread
(BENCHMARKS.md 2026-12-07, fifty-eighth session).
"""

from __future__ import annotations

import os
from collections.abc import Iterator


def subdirectories(directory: str) -> list[str] | None:
    """The names of ``directory``'s subdirectories, in the order the kernel lists them, symbolic
    links not followed; None where it cannot be listed (removed meanwhile, or unreadable)."""
    try:
        with os.scandir(directory) as entries:
            return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return None


def directories(top: str) -> Iterator[str]:
    """``top`` and every directory below it, each before its subdirectories (in the order the
    kernel lists them); symbolic links are not followed, and a directory removed or unreadable
    meanwhile is skipped with what is below it."""
    stack = [top]
    while stack:
        directory = stack.pop()
        below = subdirectories(directory)
        if below is None:
            continue
        yield directory
        stack.extend(os.path.join(directory, name) for name in reversed(below))
