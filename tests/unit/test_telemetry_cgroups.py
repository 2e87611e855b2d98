"""Cgroup v2 ids and paths: mount discovery, path forms, the id <-> path cache."""

import os
from pathlib import Path

import pytest

from qpolicy.telemetry.cgroups import CgroupError, CgroupMap, cgroup2_mount, normalize, within

HYBRID = """sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_the_cgroup2_mount_is_found_not_assumed() -> None:
    assert cgroup2_mount(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == Path("/sys/fs/cgroup")
    assert cgroup2_mount("none /my\\040cgroups cgroup2 rw 0 0\n") == Path("/my cgroups")
    with pytest.raises(CgroupError, match="no cgroup v2 hierarchy"):
        cgroup2_mount("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")


def test_the_running_systems_mount() -> None:
    mount = cgroup2_mount()
    assert (mount / "cgroup.procs").exists()


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("/", "/"),
        ("", "/"),
        ("a/b/", "/a/b"),
        ("//a//./b", "/a/b"),
        ("/kubepods.slice", "/kubepods.slice"),
    ],
)
def test_normalize(path: str, normal: str) -> None:
    assert normalize(path) == normal


def test_normalize_refuses_parent_references() -> None:
    with pytest.raises(CgroupError, match="must not contain"):
        normalize("/a/../b")


def test_within() -> None:
    assert within("/a/b", "/a")
    assert within("/a", "/a")
    assert within("/anything", "/")
    assert not within("/ab", "/a")
    assert not within("/", "/a")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ids_are_directory_inodes_and_paths_come_back(tmp_path: Path) -> None:
    (tmp_path / "kubepods.slice" / "pod-x").mkdir(parents=True)
    clock = Clock()
    cgroups = CgroupMap(tmp_path, clock=clock)
    pod = cgroups.id_of("/kubepods.slice/pod-x")
    assert pod == os.stat(tmp_path / "kubepods.slice" / "pod-x").st_ino
    root = os.stat(tmp_path).st_ino
    fresh = CgroupMap(tmp_path, clock=clock)
    assert fresh.path_of(pod) == "/kubepods.slice/pod-x"  # a miss walks the tree
    assert fresh.path_of(root) == "/"
    with pytest.raises(CgroupError, match="/nope"):
        cgroups.id_of("/nope")


def test_a_miss_walks_again_at_most_every_half_second(tmp_path: Path) -> None:
    clock = Clock()
    cgroups = CgroupMap(tmp_path, clock=clock)
    assert cgroups.path_of(123456789) is None  # walked
    (tmp_path / "late").mkdir()
    late = os.stat(tmp_path / "late").st_ino
    assert cgroups.path_of(late) is None  # too soon to walk again
    clock.now += 0.5
    assert cgroups.path_of(late) == "/late"
    # Removed cgroups keep their paths: ids are never reused.
    (tmp_path / "late").rmdir()
    clock.now += 1
    cgroups.refresh()
    assert cgroups.path_of(late) == "/late"


def test_a_known_path_is_only_what_was_learnt(tmp_path: Path) -> None:
    """What is only shown (the rm backend's busiest cgroups, in every status write) must not walk
    the hierarchy for an id it never learnt: a removed cgroup stays among the busiest."""
    (tmp_path / "pod").mkdir()
    clock = Clock()
    cgroups = CgroupMap(tmp_path, clock=clock)
    pod = os.stat(tmp_path / "pod").st_ino
    assert cgroups.known_path(pod) is None
    assert cgroups._walked_at is None  # not walked
    assert cgroups.path_of(pod) == "/pod"
    assert cgroups.known_path(pod) == "/pod"
