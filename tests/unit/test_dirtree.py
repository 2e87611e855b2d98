"""qpolicy.runtime.dirtree: the cgroup walks' own stack, and the walks that use it on a tree
deeper than Python's recursion (os.walk raised RecursionError there in Python 3.11)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from qpolicy.desired.annotations import scan
from qpolicy.runtime import dirtree
from qpolicy.runtime.dirtree import directories
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.gpuprocs import cgroup_procs
from tests.annotated_tree import annotate, nested, xattr_root

DEPTH = 1200  # past the recursion limit (1 000), and a path well within PATH_MAX


def test_it_lists_each_directory_before_those_below_it_and_follows_no_link(tmp_path: Path) -> None:
    for sub in ("b/x", "b/y/z", "c"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "b" / "file").write_text("")
    os.symlink(tmp_path / "b", tmp_path / "link")
    found = list(directories(str(tmp_path)))
    assert sorted(found) == sorted(
        str(tmp_path / p) if p else str(tmp_path) for p in ("", "b", "b/x", "b/y", "b/y/z", "c")
    )
    for directory in found:
        parent = os.path.dirname(directory)
        if directory != str(tmp_path):
            assert found.index(parent) < found.index(directory)


def test_a_missing_top_and_a_directory_that_vanishes_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert list(directories(str(tmp_path / "none"))) == []
    (tmp_path / "gone" / "below").mkdir(parents=True)
    (tmp_path / "kept").mkdir()
    real = os.scandir

    def scandir(path: str) -> os.ScandirIterator[str]:
        if path.endswith("/gone"):
            raise FileNotFoundError(path)  # removed between its parent's listing and its own
        return real(path)

    monkeypatch.setattr(dirtree.os, "scandir", scandir)
    assert sorted(directories(str(tmp_path))) == [str(tmp_path), str(tmp_path / "kept")]


def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path: Path) -> None:
    assert sys.getrecursionlimit() < DEPTH
    with nested(tmp_path, DEPTH) as deep:
        found = list(directories(str(tmp_path)))
        assert len(found) == DEPTH + 1 and found[-1] == str(deep)


def test_the_walks_of_a_tenants_subtree_reach_its_deepest_cgroup(tmp_path: Path) -> None:
    """The unseen-process look's walk of a pod, the cgroup map's walk for an unknown id, and
    scan() (the annotations without inotify's reference), on a pod 1 200 cgroups deep."""
    root = xattr_root(tmp_path / "cgroup")
    with nested(root / "pod", DEPTH) as deep:
        (deep / "cgroup.procs").write_text("4242\n")
        annotate(deep, share="10")
        assert [pids for pids in cgroup_procs(root, "/pod") if pids] == [[4242]]
        cgroups = CgroupMap(root=root)
        assert cgroups.path_of(deep.stat().st_ino) == "/pod" + "/a" * DEPTH
        assert list(scan(root).pods) == ["/pod" + "/a" * DEPTH]
