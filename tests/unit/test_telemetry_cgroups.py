"""Cgroup v2 ids and paths: mount discovery, path forms, the id <-> path cache."""

import os
from pathlib import Path

import pytest

from qpolicy.telemetry.cgroups import (
    WALK_SHARE,
    CgroupError,
    CgroupMap,
    CgroupsById,
    cgroup2_mount,
    normalize,
    within,
)
from tests.annotated_tree import small_tenant_tree
from tests.timers import Stepping
from tools.bench.common import SimClock

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


class ById:
    """CgroupsById as a kernel with file handles answers it: ids opened, the gone ones None."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.paths = paths
        self.asked: list[int] = []
        self.failing: OSError | None = None

    def path_of(self, cgid: int) -> str | None:
        self.asked.append(cgid)
        if self.failing is not None:
            raise self.failing
        return self.paths.get(cgid)

    def close(self) -> None:
        self.paths = {}


def test_an_unknown_id_is_opened_by_id_not_walked_for(tmp_path: Path) -> None:
    """A tenant chooses how many cgroups there are and how often a GPU process starts in a new
    one: each unknown id walked the whole hierarchy (a tenant's 5 450 cgroups: ~200 ms, up to
    twice a second). Where cgroups can be opened by id, nothing is walked: a new cgroup's path
    is read back, a removed one's is None at once, and each id is asked once."""
    (tmp_path / "pod" / "job-1").mkdir(parents=True)
    job = os.stat(tmp_path / "pod" / "job-1").st_ino
    ids = ById({job: "/pod/job-1"})
    clock = Clock()
    cgroups = CgroupMap(tmp_path, clock=clock, by_id=lambda root: ids)
    assert cgroups.by_id
    assert cgroups.path_of(job) == "/pod/job-1" and cgroups.path_of(job) == "/pod/job-1"
    assert cgroups.path_of(987654321) is None and cgroups.path_of(987654321) is None
    assert ids.asked == [job, 987654321, 987654321] and cgroups.walks == 0
    assert cgroups.opened == 3
    # Asking failed (not an answer: out of descriptors, say): the walk, as without handles.
    (tmp_path / "late").mkdir()
    late = os.stat(tmp_path / "late").st_ino
    ids.failing = OSError(24, "Too many open files")
    assert cgroups.path_of(late) == "/late" and cgroups.walks == 1
    cgroups.close()
    assert ids.paths == {}


def test_without_handles_walks_for_unknown_ids_are_spaced_to_a_share_of_a_core(
    tmp_path: Path,
) -> None:
    """Where cgroups cannot be opened by id (a test's directory, no CAP_DAC_READ_SEARCH, an old
    kernel), an unknown id walks, at most every 0.5 s and no more often than keeps the walks at
    WALK_SHARE of a core: a walk that cost 50 ms is not repeated for 5 s."""
    for index in range(10):
        (tmp_path / f"pod{index}").mkdir()
    clock = Clock()
    timer = Stepping(0.025)  # a walk reads the timer twice: it costs 25 ms
    cgroups = CgroupMap(tmp_path, clock=clock, timer=timer, by_id=lambda root: None)
    assert not cgroups.by_id
    assert cgroups.path_of(111) is None and cgroups.walks == 1
    assert cgroups.walk_cost_s == pytest.approx(0.025)
    assert cgroups.walk_every_s == pytest.approx(0.025 / WALK_SHARE)
    (tmp_path / "late").mkdir()
    late = os.stat(tmp_path / "late").st_ino
    clock.now += 2.0  # past REFRESH_MIN_S, not yet past the walk's share
    assert cgroups.path_of(late) is None and cgroups.walks == 1
    clock.now += 0.5
    assert cgroups.path_of(late) == "/late" and cgroups.walks == 2


def test_a_test_directory_cannot_be_opened_by_id(tmp_path: Path) -> None:
    """The real CgroupsById on a directory that is not a cgroup2 mount: its file handles are not
    kernfs ids, so unknown ids are walked for (the VM's tests open cgroupfs by id)."""
    assert CgroupsById.open(tmp_path) is None
    cgroups = CgroupMap(tmp_path, clock=Clock())
    assert not cgroups.by_id and cgroups.path_of(os.stat(tmp_path).st_ino) == "/"
    assert cgroups.walks == 1


def test_the_bench_asks_for_a_new_cgroup_a_tick_and_says_how_late_each_was_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench`'s cgroupids rows on a small tree: the map before walks every 0.5 s whatever
    a walk costs; spaced, a walk of 10 ms waits 1 s; each new cgroup's path is known by the next
    walk, and the bench's cgroups are removed."""
    from tools.bench import cgroupids as bench

    monkeypatch.setattr(bench, "SECONDS", 10)
    root = tmp_path / "tenant"
    jobs = small_tenant_tree(root, monkeypatch, 200)
    groups = sorted(jobs.iterdir())
    clock = SimClock()
    before = bench.measure(bench._WalkEveryHalfSecond(root, clock, by_id=None_), clock, jobs)
    clock = SimClock()
    spaced = CgroupMap(root, clock, timer=Stepping(0.01), by_id=None_)  # walks of 10 ms
    after = bench.measure(spaced, clock, jobs)
    assert before["walks"] == 20 and after["walks"] == 10
    for row in (before, after):
        assert row["resolved"] + row["unresolved"] == 100 and row["opened_by_id"] == 0
    assert before["late_s_most"] == pytest.approx(0.4)
    assert after["late_s_most"] == pytest.approx(0.9)
    assert sorted(jobs.iterdir()) == groups


def None_(root: Path) -> None:
    """No opening by id (as without CAP_DAC_READ_SEARCH)."""
    return None


def test_an_id_no_kernfs_node_can_have_is_none_without_asking() -> None:
    """A cgroup id is a u64 the probe reads from the kernel; anything else names no cgroup and
    is not packed into a handle (struct.error would not be an OSError the map catches)."""
    ids = CgroupsById(Path("/nowhere"), -1)
    assert [ids.path_of(cgid) for cgid in (0, -5, 1 << 64)] == [None, None, None]
