"""Annotations kept by inotify (qpolicy.desired.annotationwatch) are what a walk would find, and a
refresh with nothing changed walks nothing. Real inotify on a directory of this machine that takes
user.* attributes; tests/vm/test_annotation_watch.py does the same on cgroupfs."""

from __future__ import annotations

import logging
import os
import random
import shutil
import struct
from pathlib import Path

import pytest

from qpolicy.desired import annotationwatch
from qpolicy.desired.annotations import scan
from qpolicy.desired.annotationwatch import AnnotationWatch
from qpolicy.model import PodClass, PodSpec
from qpolicy.runtime import inotify
from qpolicy.runtime.inotify import Event, Inotify
from tests.annotated_tree import Clock, annotate, nested, record_watch_walks, xattr_root
from tests.timers import Stepping


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return xattr_root(tmp_path / "cgroup")


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return record_watch_walks(monkeypatch)


def test_it_starts_with_what_a_walk_finds(root: Path) -> None:
    annotate(root / "kube" / "web", **{"class": "online", "share": "30"})
    annotate(root / "kube" / "bad", share="150")
    (root / "kube" / "plain" / "c1").mkdir(parents=True)
    watch = AnnotationWatch(root, timer=Clock())
    assert watch.annotations == scan(root)
    assert list(watch.annotations.pods) == ["/kube/web"]
    assert list(watch.annotations.errors) == ["/kube/bad"]
    assert watch.watches == 6 and watch.unwatched is None
    assert watch.refresh() is False
    watch.close()


def test_a_refresh_with_nothing_changed_walks_nothing(root: Path, walks: list[str]) -> None:
    (root / "kube" / "pod").mkdir(parents=True)
    for i in range(60):  # a cgroup's control files: written to, never annotated
        (root / "kube" / "pod" / f"file{i}").write_text("")
    clock = Clock(1000.0)
    watch = AnnotationWatch(root, timer=Clock(), clock=clock)
    assert walks == [str(root), str(root / "kube"), str(root / "kube" / "pod")]
    for _ in range(30):
        clock.now += 1.0
        (root / "kube" / "pod" / "file0").write_text("1")  # like cgroup.procs
        assert watch.refresh() is False
    assert len(walks) == 3  # nothing listed again
    watch.close()


def test_an_attribute_written_on_a_directory_is_read_there_alone(
    root: Path, walks: list[str]
) -> None:
    (root / "kube" / "web").mkdir(parents=True)
    watch = AnnotationWatch(root, timer=Clock())
    walked = len(walks)
    annotate(root / "kube" / "web", **{"class": "online"})
    assert watch.refresh() is True
    assert watch.annotations.pods == {"/kube/web": PodSpec("/kube/web", 0, PodClass.ONLINE)}
    os.setxattr(root / "kube" / "web", "user.qpolicy.share", b"40")
    assert watch.refresh() is True
    assert watch.annotations.pods["/kube/web"].share == 40
    os.removexattr(root / "kube" / "web", "user.qpolicy.share")
    os.removexattr(root / "kube" / "web", "user.qpolicy.class")
    assert watch.refresh() is True and watch.annotations.pods == {}
    assert len(walks) == walked  # nothing listed again
    watch.close()


def test_a_new_subtree_is_walked_alone_and_watched(root: Path, walks: list[str]) -> None:
    (root / "kube").mkdir()
    watch = AnnotationWatch(root, timer=Clock())
    walked = len(walks)
    # A pod's slice and its containers made at once, before the watch reads its events.
    (root / "kube" / "pod1" / "ctr-a").mkdir(parents=True)
    (root / "kube" / "pod1" / "ctr-b").mkdir()
    annotate(root / "kube" / "pod1", share="20")
    assert watch.refresh() is True
    assert list(watch.annotations.pods) == ["/kube/pod1"]
    pod = root / "kube" / "pod1"
    assert sorted(walks[walked:]) == [str(pod), str(pod / "ctr-a"), str(pod / "ctr-b")]
    # Now watched: a container made later, annotated, is seen too.
    annotate(root / "kube" / "pod1" / "ctr-c", **{"class": "online"})
    assert watch.refresh() is True
    assert list(watch.annotations.pods) == ["/kube/pod1", "/kube/pod1/ctr-c"]
    assert watch.watches == 6
    watch.close()


def test_removed_and_renamed_directories_take_their_pods_with_them(root: Path) -> None:
    annotate(root / "kube" / "a" / "x", share="10")
    annotate(root / "kube" / "b", share="20")
    watch = AnnotationWatch(root, timer=Clock())
    shutil.rmtree(root / "kube" / "b")
    assert watch.refresh() is True
    assert list(watch.annotations.pods) == ["/kube/a/x"]
    (root / "kube" / "a").rename(root / "kube" / "c")
    assert watch.refresh() is True
    assert list(watch.annotations.pods) == ["/kube/c/x"]
    # The renamed subtree is watched under its new name.
    os.setxattr(root / "kube" / "c" / "x", "user.qpolicy.share", b"30")
    assert watch.refresh() is True
    assert watch.annotations.pods == {"/kube/c/x": PodSpec("/kube/c/x", 0, share=30)}
    assert watch.watches == 4  # /, /kube, /kube/c, /kube/c/x
    # Moved out of the tree (cgroupfs renames only within it; any other filesystem can).
    (root / "kube" / "c").rename(root.parent / "outside")
    assert watch.refresh() is True
    assert watch.annotations.pods == {} and watch.watches == 2
    watch.close()


VALUES = {"class": ["online", "offline", "urgent"], "share": ["10", "30", "150"], "gpu": ["0"]}


def _change(rng: random.Random, root: Path, dirs: list[Path], step: int) -> None:
    """One random mkdir, rmdir, rename, setxattr or removexattr under ``root``."""
    live = [d for d in dirs if d.exists()]
    choice = rng.random()
    if choice < 0.3 or len(live) < 3:
        parent = rng.choice(live)
        child = parent / f"d{step}"
        child.mkdir()
        dirs.append(child)
        if rng.random() < 0.5:  # made and annotated at once
            annotate(child, share=rng.choice(VALUES["share"]))
    elif choice < 0.45:
        victim = rng.choice([d for d in live if d != root])
        shutil.rmtree(victim)
    elif choice < 0.55:
        moved = rng.choice([d for d in live if d != root])
        target = moved.parent / f"r{step}"
        moved.rename(target)
        dirs.append(target)
        dirs += [Path(p) for p, _, _ in os.walk(target)]
    elif choice < 0.85:
        key = rng.choice(list(VALUES))
        annotate(rng.choice(live), **{key: rng.choice(VALUES[key])})
    else:
        target = rng.choice(live)
        names = [n for n in os.listxattr(target) if n.startswith("user.qpolicy.")]
        if names:
            os.removexattr(target, rng.choice(names))


def test_any_sequence_of_changes_ends_where_a_walk_would(root: Path, walks: list[str]) -> None:
    """300 random mkdir, rmdir, rename, setxattr and removexattr, a refresh after each one to
    five of them: the watch always equals a fresh walk, and never walked the whole tree again."""
    rng = random.Random(20261207)
    clock = Clock(1000.0)
    watch = AnnotationWatch(root, timer=Clock(), clock=clock)
    dirs = [root]
    for step in range(300):
        _change(rng, root, dirs, step)
        if rng.random() < 0.4:
            clock.now += 0.1  # 12 s in all: no safety walk comes due
            watch.refresh()
            assert watch.annotations == scan(root), step
    watch.refresh()
    assert watch.annotations == scan(root)
    assert watch.annotations.pods and watch.annotations.errors  # the run made both
    assert walks.count(str(root)) == 1
    watch.close()


def test_changes_amid_unfinished_slices_and_walks_end_where_a_walk_would(
    root: Path, walks: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same random changes, but each refresh does a directory or two (a slice of four reads
    of the timer), queues overflow now and then, and safety walks come due: events land
    between the visits of a walk and of new subtrees. Whenever the refreshes have caught up,
    the watch equals a fresh walk and watches every directory of the tree, and nothing else."""
    rng = random.Random(20261208)
    clock = Clock(1000.0)
    timer = Stepping(annotationwatch.SLICE_S / 4)
    monkeypatch.setattr(Overflowing, "overflow", False)
    watch = AnnotationWatch(root, timer=timer, clock=clock, inotify=Overflowing)
    dirs = [root]
    for step in range(400):
        _change(rng, root, dirs, step)
        Overflowing.overflow = rng.random() < 0.03
        clock.now += 0.5  # 200 s in all: safety walks come due
        if rng.random() < 0.7:
            watch.refresh()
        if step % 25 == 24:
            for _ in range(400):  # catch up
                clock.now += 0.001
                watch.refresh()
            directories = sum(1 for _ in os.walk(root))
            assert watch.annotations == scan(root), step
            assert watch.watches == directories and watch.directories == directories, step
    assert walks.count(str(root)) >= 4  # safety walks and overflows, with the changes amid
    assert watch.annotations.pods and watch.annotations.errors
    watch.close()


def test_the_tree_is_walked_again_after_a_safety_interval(root: Path, walks: list[str]) -> None:
    clock = Clock(1000.0)
    watch = AnnotationWatch(root, timer=Clock(), clock=clock)
    clock.now += annotationwatch.RESCAN_EVERY_S - 1
    watch.refresh()
    assert walks == [str(root)]
    clock.now += 1
    watch.refresh()
    assert walks == [str(root), str(root)]  # /, listed again
    watch.close()


class Overflowing(Inotify):
    """Real inotify whose next read reports the queue overflowed."""

    overflow = False

    def read_some(self) -> list[Event]:
        events = super().read_some()
        if Overflowing.overflow:
            Overflowing.overflow = False
            return [Event(-1, inotify.IN_Q_OVERFLOW, 0, "")]
        return events


def test_an_overflowed_queue_is_made_good_by_a_walk(root: Path, walks: list[str]) -> None:
    watch = AnnotationWatch(root, timer=Clock(), inotify=Overflowing)
    annotate(root / "lost", share="10")
    Overflowing.overflow = True  # its events dropped: only a walk can see /lost
    assert watch.refresh() is True  # (the walks cost nothing by this timer: no wait)
    assert list(watch.annotations.pods) == ["/lost"]
    assert walks.count(str(root)) == 2
    watch.close()


def test_without_inotify_the_tree_is_walked_every_second_and_the_reason_logged_once(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def refused() -> Inotify:
        raise OSError(24, "Too many open files")

    clock = Clock(1000.0)
    with caplog.at_level(logging.WARNING):
        watch = AnnotationWatch(root, timer=Clock(), clock=clock, inotify=refused)
        annotate(root / "pod", share="10")
        assert watch.refresh() is False  # within the second
        clock.now += 1.0
        assert watch.refresh() is True
    assert list(watch.annotations.pods) == ["/pod"]
    assert watch.unwatched == "no inotify instance (Too many open files)"
    assert [r.getMessage() for r in caplog.records] == [
        f"annotations: no inotify instance (Too many open files); walking {root} instead, every"
        " 1 s or as often as 1 % of a core allows (raise fs.inotify.max_user_watches or"
        " max_user_instances to watch it again)"
    ]


class Limited(Inotify):
    """Real inotify that refuses a third watch, as the kernel does past max_user_watches."""

    def __init__(self) -> None:
        super().__init__()
        self.added = 0

    def add(self, path: str, mask: int) -> int:
        self.added += 1
        if self.added > 2:
            raise OSError(28, "No space left on device", path)
        return super().add(path, mask)


def test_a_watch_limit_reached_falls_back_to_walking_with_nothing_missed(root: Path) -> None:
    for name in ("a", "b", "c", "d"):
        annotate(root / name, share="10")
    clock = Clock(1000.0)
    watch = AnnotationWatch(root, timer=Clock(), clock=clock, inotify=Limited)
    assert watch.annotations == scan(root) and len(watch.annotations.pods) == 4
    assert watch.unwatched is not None and "No space left on device" in watch.unwatched
    assert watch.watches == 0
    annotate(root / "e", share="10")
    clock.now += 1.0
    assert watch.refresh() is True and len(watch.annotations.pods) == 5


def test_parse_reads_names_and_nul_padding() -> None:
    def event(wd: int, mask: int, name: bytes, pad: int) -> bytes:
        raw = name + b"\0" * pad
        return struct.pack("=iIII", wd, mask, 0, len(raw)) + raw

    buffer = event(1, inotify.IN_CREATE | inotify.IN_ISDIR, b"pod-a", 11) + event(
        2, inotify.IN_ATTRIB, b"", 0
    )
    assert inotify.parse(buffer) == [
        Event(1, inotify.IN_CREATE | inotify.IN_ISDIR, 0, "pod-a"),
        Event(2, inotify.IN_ATTRIB, 0, ""),
    ]


def test_a_closed_watch_holds_no_descriptor(root: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    watch = AnnotationWatch(root, timer=Clock())
    assert len(os.listdir("/proc/self/fd")) == before + 1
    watch.close()
    watch.close()  # twice is no error
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_bench_builds_a_node_shaped_tree_and_checks_the_watch_against_a_walk(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench`'s annotations row (tools/bench/annotations.py) on a small tree: its counts
    are the tree's, and the watch it times found what a walk finds (measure() asserts it)."""
    from tools.bench import annotations as bench

    monkeypatch.setattr(bench, "FILES", 2)
    row = bench.measure(root, 3)
    # /, system.slice, 40 units, kubepods.slice, burstable, 3 pods of 1 + 3 containers.
    assert row["directories"] == 1 + 1 + 40 + 1 + 1 + 3 * 4
    assert row["entries"] == row["directories"] * 3
    assert set(row) >= {"walk_per_s_percent", "watch_idle_per_s_percent", "watch_new_pod_ms"}
    assert list(root.iterdir()) == []  # the tree is taken down


def test_a_flood_of_new_cgroups_is_taken_in_slices_and_nothing_is_missed(
    root: Path, walks: list[str]
) -> None:
    """A tenant makes 400 cgroups (some annotated) at once: each refresh lists a slice's worth
    of them (the loop thread hands GPUs over meanwhile), and the slices end where a walk
    would, without a whole walk."""
    (root / "tenant").mkdir()
    timer = Stepping(0.0001)  # 20 reads of the timer to a 2 ms slice
    watch = AnnotationWatch(root, clock=Clock(1000.0), timer=timer)
    walked = len(walks)
    for group in range(20):
        for leaf in range(19):
            (root / "tenant" / f"g{group}" / f"c{leaf}").mkdir(parents=True)
        annotate(root / "tenant" / f"g{group}", share="5")
    per_refresh = []
    for _ in range(200):
        before = len(walks)
        watch.refresh()
        per_refresh.append(len(walks) - before)
    assert watch.annotations == scan(root) and len(watch.annotations.pods) == 20
    assert sorted(walks[walked:]) == sorted(
        str(p) for p in (root / "tenant").rglob("*") if p.is_dir()
    )  # each new directory listed once, nothing else
    busy = [n for n in per_refresh if n]
    assert max(busy) <= annotationwatch.SLICE_S / timer.step
    assert len(busy) >= 400 / (annotationwatch.SLICE_S / timer.step)
    assert watch.watches == 2 + 400
    watch.close()


def test_whole_walks_are_spaced_to_a_share_of_a_core_however_big_the_tree(
    root: Path, walks: list[str]
) -> None:
    """Without inotify, a tree whose walk costs 60 ms by the timer is walked every 6 s, not
    every second; an overflowed queue waits for the same share."""
    for group in range(10):
        for leaf in range(20):
            (root / f"g{group}" / f"c{leaf}").mkdir(parents=True)

    def refused() -> Inotify:
        raise OSError(24, "Too many open files")

    clock = Clock(1000.0)
    timer = Stepping(0.0003)
    watch = AnnotationWatch(root, clock=clock, timer=timer, inotify=refused)
    assert watch.directories == 211
    # A read of the timer a directory and a few around it: 211 x 0.3 ms, about 64 ms.
    assert 0.06 <= watch.walk_cost_s <= 0.07
    assert watch.walk_every_s == pytest.approx(watch.walk_cost_s / annotationwatch.WALK_SHARE)
    starts, costs = [1000.0], []
    for tick in range(600):  # a minute of the daemon's ticks
        clock.now = 1000.0 + tick * 0.1
        before = walks.count(str(root))
        watch.refresh()
        if walks.count(str(root)) > before:
            starts.append(clock.now)
            costs.append(watch.walk_cost_s)  # the walk before's
    # Each walk started once the one before had taken 1 % of the time since its start.
    for start, next_start, cost in zip(starts, starts[1:], costs, strict=False):
        assert cost / annotationwatch.WALK_SHARE <= next_start - start <= cost / 0.008
    assert len(starts) >= 5 and min(costs) >= 0.06
    # A walk's work per refresh is one slice, not the whole walk at once.
    assert watch.walk_cost_s / annotationwatch.SLICE_S > 20


class Capped(Inotify):
    """Real inotify that refuses more than ``cap`` watches, as max_user_watches does."""

    cap = 2

    def __init__(self) -> None:
        super().__init__()
        self.added = 0

    def add(self, path: str, mask: int) -> int:
        self.added += 1
        if self.added > Capped.cap:
            raise OSError(28, "No space left on device", path)
        return super().add(path, mask)


def test_a_watch_given_up_at_a_limit_watches_again_once_the_limit_is_raised(
    root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        annotate(root / name, share="10")
    monkeypatch.setattr(Capped, "cap", 2)
    clock = Clock(1000.0)
    watch = AnnotationWatch(
        root, clock=clock, timer=Clock(), inotify=Capped, limits=lambda: (128, Capped.cap)
    )
    assert watch.unwatched is not None and watch.watches == 0
    assert len(watch.annotations.pods) == 3
    clock.now += 5.0
    watch.refresh()
    assert watch.unwatched is not None  # the limit is as it was: not tried again
    Capped.cap = 100
    annotate(root / "d", share="10")
    clock.now += 1.0
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert watch.refresh() is True
    assert list(watch.annotations.pods) == ["/a", "/b", "/c", "/d"]
    assert watch.unwatched is None and watch.watches == 5
    assert [r.getMessage() for r in caplog.records] == [
        f"annotations: inotify limits raised to (128, 100); watching {root} again"
    ]
    # Watched now: a new pod is seen at the next refresh, with no walk due.
    annotate(root / "e", share="10")
    clock.now += 0.1
    assert watch.refresh() is True and "/e" in watch.annotations.pods
    watch.close()


def test_the_bench_times_a_tenants_tree_watched_and_walked(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench`'s tenant rows on a small tree: both ways end where a walk does (tenant()
    asserts it), and the rows carry what the targets are judged on."""
    from tools.bench import annotations as bench

    monkeypatch.setattr(bench, "FILES", 2)
    monkeypatch.setattr(bench, "TENANT_FILES", 2)
    monkeypatch.setattr(bench, "TENANT_CGROUPS", 150)
    monkeypatch.setattr(bench, "TENANT_SECONDS", 3)
    rows = bench.tenant(root)
    assert set(rows) == {"tenant, watched", "tenant, walked"}
    for row in rows.values():
        assert row["directories"] == 1 + 1 + 40 + 1 + 1 + 100 * 4 + 150 + 2
        assert row["longest_refresh_ms"] > 0 and row["cpu_percent"] > 0
        assert isinstance(row["meets_target"], bool)
    assert list(root.iterdir()) == []


class AlwaysOverflowing(Inotify):
    """Real inotify whose every read adds an overflow: a flood the watch cannot keep up with."""

    def read_some(self) -> list[Event]:
        return [*super().read_some(), Event(-1, inotify.IN_Q_OVERFLOW, 0, "")]


def test_a_flood_that_keeps_overflowing_the_queue_is_said_once_a_walk(
    root: Path, walks: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    for group in range(10):
        (root / f"g{group}" / "c").mkdir(parents=True)
    clock = Clock(1000.0)
    timer = Stepping(0.0002)
    with caplog.at_level(logging.INFO):
        watch = AnnotationWatch(root, clock=clock, timer=timer, inotify=AlwaysOverflowing)
        spacing = watch.walk_cost_s / annotationwatch.WALK_SHARE
        for _ in range(600):  # a minute of ticks, each reading an overflow
            clock.now += 0.1
            watch.refresh()
    walked = walks.count(str(root))
    # One walk per spacing (the first at start), however many overflows were read.
    assert watch.overflows >= 600
    assert 60 / (spacing + 1) <= walked - 1 <= 60 / spacing + 1
    messages = [r.getMessage() for r in caplog.records]
    assert walked - 1 <= len(messages) <= walked  # the last may be due after the minute
    assert all("event queue overflowed" in m for m in messages)
    watch.close()


def test_a_tenants_cgroups_nested_deeper_than_pythons_recursion_are_walked(root: Path) -> None:
    """A delegated subtree 1 200 cgroups deep (cgroup.max.depth is "max" unless set): os.walk
    recursed a frame a level and raised RecursionError, so every refresh of the desired state
    failed, state file and Kubernetes included. The watch's walk keeps its own stack."""
    with nested(root, 1200) as deep:
        annotate(deep, share="10")
        watch = AnnotationWatch(root, timer=Clock())
        assert list(watch.annotations.pods) == ["/a" * 1200]
        assert watch.watches == 1201
        annotate(deep / "b", share="20")
        assert watch.refresh() is True and len(watch.annotations.pods) == 2
        watch.close()
