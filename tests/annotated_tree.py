"""Helpers for tests of cgroup annotations on a directory tree: one that takes user.* extended
attributes (skipped where the filesystem takes none), attributes written on it, a clock the
test moves, and a record of the walks the annotation watch makes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpolicy.desired import annotationwatch


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def xattr_root(path: Path) -> Path:
    """``path``, made, where it takes user.* attributes; else the test is skipped."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.setxattr(path, "user.qpolicy.x", b"1")
        os.removexattr(path, "user.qpolicy.x")
    except OSError:
        pytest.skip(f"{path} does not take user.* extended attributes")
    return path


def annotate(directory: Path, **values: str | bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in values.items():
        raw = value if isinstance(value, bytes) else value.encode()
        os.setxattr(directory, f"user.qpolicy.{key}", raw)


def record_watch_walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories the annotation watch lists from now on, in order (a whole walk lists the
    root first); a walk of the test's own, by scan(), is not counted."""
    listed: list[str] = []
    real = annotationwatch.subdirectories

    def subdirectories(directory: str) -> list[str] | None:
        listed.append(directory)
        return real(directory)

    monkeypatch.setattr(annotationwatch, "subdirectories", subdirectories)
    return listed


def remove_tree(top: Path) -> None:
    """Removes ``top`` and all below it, however deep: shutil.rmtree (pytest's cleanup of old
    temporary directories too) recurses a frame per level and raises past about 1 000."""
    from qpolicy.runtime.dirtree import directories

    for directory in reversed(list(directories(str(top)))):
        for entry in os.scandir(directory):
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        os.rmdir(directory)


@contextlib.contextmanager
def nested(top: Path, depth: int) -> Iterator[Path]:
    """``depth`` directories nested one in another under ``top`` (made if need be); the deepest.
    Removed afterwards by remove_tree: pytest's cleanup of old temporary directories could not."""
    deep = top
    try:
        for _ in range(depth):
            deep = deep / "a"
            deep.mkdir(parents=True)
        yield deep
    finally:
        if (top / "a").exists():
            remove_tree(top / "a")


def small_tenant_tree(root: Path, monkeypatch: pytest.MonkeyPatch, cgroups: int) -> Path:
    """The benches' tenant tree (tools/bench/annotations.py) at a size a test can afford: two
    files a cgroup and ``cgroups`` of the tenant's own, made at ``root``. Returns the container
    cgroup that holds the tenant's."""
    from tools.bench import annotations as bench

    monkeypatch.setattr(bench, "FILES", 2)
    monkeypatch.setattr(bench, "TENANT_FILES", 2)
    monkeypatch.setattr(bench, "TENANT_CGROUPS", cgroups)
    bench._tenant_tree(root)
    return root / "kubepods.slice" / "kubepods-pod1.slice" / "cri-containerd-0.scope"
