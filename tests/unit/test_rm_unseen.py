"""The pods' processes the probe never saw: found in their cgroups, searched for in RM, governed."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from qpolicy.enforcers.rm import handles
from qpolicy.enforcers.rm.unseen import LOOK_EVERY_S, LOOK_SHARE, UnseenProcesses, governable
from qpolicy.nvrm import discover
from qpolicy.nvrm.abi import Node
from qpolicy.nvrm.tracker import Tracker
from qpolicy.telemetry.gpuprocs import cgroup_procs
from tests.annotated_tree import small_tenant_tree
from tests.timers import Stepping
from tests.unit.rm_double import RmDouble, traced_process

PID = 4242
FILES = {8: Node.CTL, 11: Node.GPU, 15: Node.CTL, 17: Node.CTL}


def trace_tracker(pid: int) -> Tracker:
    tracker = Tracker()
    tracker.adopt(traced_process(pid))
    return tracker


class Node_:
    """The node as UnseenProcesses sees it: pods' members, their files, their start times."""

    def __init__(self) -> None:
        self.members: dict[str, list[int]] = {"/a": [PID]}
        self.files: dict[int, dict[int, Node]] = {PID: dict(FILES)}
        self.started: dict[int, int] = {PID: 777}
        self.cuda: set[int] = {PID}
        self.gone: set[int] = set()
        # The newest client the previous daemon saw made: the trace's process started after.
        self.mark: int | None = 0xC1D00010
        self.now = 0.0
        self.search_now = 0.0
        self.wall = 1_800_000_000.0
        self.rm = RmDouble()
        self.tracker = Tracker()
        self.searches: list[int] = []
        #: Whether client handles can be checked without a log line (rmctl.ClientCheck).
        self.checks = False
        #: The processes whose descriptors were listed (a readlink each: not for nothing).
        self.files_read: list[int] = []

    def files_of(self, pid: int) -> dict[int, Node]:
        self.files_read.append(pid)
        return self.files.get(pid, {})

    def unseen(self, **overrides: Any) -> UnseenProcesses:
        def search_clock() -> float:
            self.search_now += 1e-6  # each look at the clock a microsecond later
            return self.search_now

        def askers(pid: int, fd: int) -> tuple[discover.Asker, Callable[[], None]]:
            # A search takes an asker per control descriptor as it starts: counted at its first.
            if fd == min(f for f, node in self.files[pid].items() if node is Node.CTL):
                self.searches.append(pid)
            return self.rm.asker(pid, fd)

        given: dict[str, Any] = {
            "askers": askers,
            "search_clock": search_clock,
            "newest": lambda: 0xC1D00021,
            "start_time": self.started.get,
            "files_of": self.files_of,
            "members": lambda root, pod: [self.members.get(pod, [])],  # one cgroup a pod
            "cuda": lambda pid: pid in self.cuda,
            "running": lambda pid, started: (
                self.started.get(pid) == started and pid not in self.gone
            ),
            "client_check": lambda: self.rm if self.checks else None,
            "wall": lambda: self.wall,
        }
        made = UnseenProcesses(
            lambda: self.tracker,
            lambda: Path("/sys/fs/cgroup"),
            lambda pid: 55,
            lambda: self.now,
            **{**given, **overrides},
        )
        made.mark = self.mark
        return made


def test_a_process_the_probe_never_saw_is_found_in_rm_and_governed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    with caplog.at_level(logging.INFO, "qpolicy.enforcers.rm.unseen"):
        unseen.look(["/a"])
        assert unseen.unseen == {"/a": [PID]} and unseen.searching
        assert node.tracker.channel_groups(PID) == []
        assert unseen.status()["last_found_at"] is None
        node.wall += 2.5
        unseen.advance(1.0)
    (group,) = node.tracker.channel_groups(PID)
    assert (group.fd, group.client, len(group.channels), group.cgroup) == (8, 0xC1D0001B, 20, 55)
    assert governable(node.tracker, PID)
    assert unseen.unseen == {} and not unseen.searching
    status = unseen.status()
    assert status["found_processes"] == 1 and status["found_channels"] == 20
    # When it was found, on the wall clock: governed from then (tools/gpu/daemon_restart.py
    # judges a searching daemon's share from it).
    assert status["last_found_at"] == 1_800_000_002.5
    assert status["controls"] == node.rm.asked and status["not_found"] == []
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("pod /a: pid 4242 uses the GPU but the probe never saw")
    assert messages[1].startswith("pod /a: pid 4242: its RM objects found by asking RM (20 chan")
    assert node.rm.open == set()
    unseen.look(["/a"])  # governed now: nothing more to search
    assert node.searches == [PID] and unseen.unseen == {}


def test_a_process_with_no_channels_to_find_is_searched_once_and_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(discover, "CLIENT_HANDLE_COUNT", 2048)
    node = Node_()
    node.rm.add(PID, 8, 0xC1D00003, {})  # NVML's kind: a client, no device
    unseen = node.unseen()
    with caplog.at_level(logging.WARNING, "qpolicy.enforcers.rm.unseen"):
        for _ in range(3):
            unseen.look(["/a"])
            while unseen.searching:
                unseen.advance(1.0)
    assert node.searches == [PID]
    assert unseen.unseen == {"/a": [PID]}
    assert unseen.status()["not_found"] == [PID]
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "pod /a: pid 4242 uses the GPU, but asking RM found none of its channels"
    )
    # The same pid, another process (its start time): searched again.
    node.started[PID] = 999
    unseen.look(["/a"])
    unseen.advance(1.0)
    assert node.searches == [PID, PID]


def test_a_search_ends_with_its_process_and_gives_its_descriptors_back() -> None:
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    unseen.look(["/a"])
    unseen.advance(0.00001)  # a slice, not the whole search: the descriptors are taken
    assert unseen.searching and node.rm.open
    node.members["/a"] = []  # it exited
    unseen.look(["/a"])
    assert not unseen.searching and node.rm.open == set() and unseen.unseen == {}


def test_what_a_search_found_is_dropped_if_its_pid_now_names_another_process() -> None:
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    unseen.look(["/a"])
    node.started[PID] = 778  # exited, and the pid reused, while the search ran
    unseen.advance(1.0)
    assert node.tracker.channel_groups(PID) == []


def test_channels_under_a_client_the_probe_did_not_see_allocated_are_searched_for() -> None:
    """A process the probe saw (a client on a file) with channels under a client whose
    allocation it lost: not governable, so searched, and the client's file found."""
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    tracker = node.tracker
    full = trace_tracker(PID).processes[PID]
    tracker.adopt(dataclasses.replace(full, clients=dict(full.clients)))
    proc = tracker.processes[PID]
    lost = proc.clients[0xC1D0001B]
    proc.clients[0xC1D0001B] = dataclasses.replace(lost, fd=None)
    assert not governable(tracker, PID)
    unseen = node.unseen()
    unseen.look(["/a"])
    assert unseen.unseen == {"/a": [PID]}
    unseen.advance(1.0)
    (group,) = tracker.channel_groups(PID)
    assert group.fd == 8 and governable(tracker, PID)


def test_processes_without_nvidia_files_or_already_governed_are_left_alone() -> None:
    node = Node_()
    node.members["/a"] = [PID, 1, 2]
    node.files[1] = {3: Node.UVM}  # nvidia-uvm alone carries no RM client
    node.files[2] = {8: Node.CTL}
    node.started.update({1: 1, 2: 2})
    node.tracker = trace_tracker(2)
    node.tracker.processes[PID] = trace_tracker(PID).processes[PID]
    unseen = node.unseen()
    unseen.look(["/a"])
    unseen.advance(1.0)  # a search wrongly started would ask now
    assert unseen.unseen == {} and node.searches == []
    # The governed processes' descriptors are not listed: the tracker answers for them.
    assert sorted(node.files_read) == [1]


def test_a_process_found_in_part_is_searched_again_by_the_next_daemon(tmp_path: Path) -> None:
    """A daemon killed midway through a search has written what it found so far: the trace's
    second client (found first: it is the newer) and not yet the one with the channels. Taken
    as known, the process would never be searched again and would run ungoverned (an H200,
    call 23C: a's share 0.37 of 0.70 through two restarts)."""
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    unseen.look(["/a"])
    while not node.tracker.processes.get(PID):
        unseen.advance(0.00005)
    proc = node.tracker.processes[PID]
    assert proc.incomplete and list(proc.clients) == [0xC1D0001D]
    assert not governable(node.tracker, PID)
    # What the daemon leaves, as the next one reads it.
    (tmp_path / handles.HANDLES_NAME).write_text(
        json.dumps(handles.dump(node.tracker, lambda pid: 777))
    )
    rm = node.rm
    nxt = Node_()
    nxt.rm = rm
    adoption = handles.adopt(
        tmp_path,
        nxt.tracker,
        lambda pid: 55,
        borrow=lambda pid, fd: os.open("/dev/null", os.O_RDONLY),
        class_of=lambda fd, client, handle: rm.clients[client][1][handle][0],
        start_time=lambda pid: 777,
        is_nvidia=lambda fd: True,
    )
    assert adoption.processes == 1 and nxt.tracker.processes[PID].incomplete
    again = nxt.unseen()
    again.look(["/a"])
    assert again.unseen == {"/a": [PID]}
    while again.searching:
        again.advance(1.0)
    (group,) = nxt.tracker.channel_groups(PID)
    assert len(group.channels) == 20 and governable(nxt.tracker, PID)
    assert not nxt.tracker.processes[PID].incomplete


def test_a_process_without_libcuda_is_reported_and_not_searched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NVML's tools hold device files and no CUDA context: a search would ask every client
    handle on each descriptor for nothing."""
    node = Node_()
    node.cuda = set()
    unseen = node.unseen()
    with caplog.at_level(logging.WARNING, "qpolicy.enforcers.rm.unseen"):
        unseen.look(["/a"])
        unseen.look(["/a"])
        unseen.advance(1.0)  # a search wrongly started would ask now
    assert node.searches == [] and unseen.unseen == {"/a": [PID]}
    status = unseen.status()
    assert status["not_searched"] == [PID] and status["not_found"] == []
    (record,) = caplog.records
    assert "without libcuda" in record.getMessage()


def test_a_search_lets_go_of_a_process_as_soon_as_it_has_exited() -> None:
    """Between two walks of the pods: the search's copies of its descriptors would otherwise
    keep its RM objects, and their GPU memory, for up to 10 s."""
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    unseen.look(["/a"])
    unseen.advance(0.00001)
    assert node.rm.open
    node.gone.add(PID)  # a zombie now: still in its cgroup until reaped
    unseen.advance(0.00001)
    assert not unseen.searching and node.rm.open == set()


def test_process_running_tells_a_live_process_from_a_gone_or_reused_pid() -> None:
    from qpolicy.enforcers.rm.record import process_running, process_start_time

    me = os.getpid()
    started = process_start_time(me)
    assert started is not None
    assert process_running(me, started)
    assert not process_running(me, started + 1)  # the pid, another process
    assert not process_running(2**22 + 1, started)  # no such pid


def test_without_a_mark_a_process_no_daemon_saw_is_reported_not_searched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first daemon on a node knows no mark: asking every client handle would write a line to
    the kernel log per one that does not exist (call 23H, an H200)."""
    node = Node_()
    node.mark = None
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    with caplog.at_level(logging.WARNING, "qpolicy.enforcers.rm.unseen"):
        unseen.look(["/a"])
        unseen.look(["/a"])
        unseen.advance(1.0)  # a search wrongly started would ask now
    assert node.searches == [] and unseen.unseen == {"/a": [PID]}
    (record,) = caplog.records
    assert "started before any daemon watched" in record.getMessage()


def test_a_client_objects_were_seen_under_is_asked_without_a_mark() -> None:
    """Events lost: the probe saw objects made under a client whose making it did not see. That
    client exists: asking it on each descriptor refuses nothing of a missing client."""
    node = Node_()
    node.mark = None
    node.rm.add_process(trace_tracker(PID).processes[PID])
    full = trace_tracker(PID).processes[PID]
    proc = dataclasses.replace(full, clients=dict(full.clients))
    proc.clients[0xC1D0001B] = dataclasses.replace(proc.clients[0xC1D0001B], fd=None)
    del proc.clients[0xC1D0001D]
    node.tracker.adopt(proc)
    unseen = node.unseen()
    unseen.look(["/a"])
    while unseen.searching:
        unseen.advance(1.0)
    (group,) = node.tracker.channel_groups(PID)
    assert group.fd == 8 and governable(node.tracker, PID)
    assert unseen.refusals.spent == 0


def test_the_mark_to_leave_moves_to_the_daemons_own_client_once_the_gap_is_searched() -> None:
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    # Before its first look, and while it searches, the gap before this daemon is not searched:
    # the mark it was given is the one to leave.
    assert unseen.mark_to_write == 0xC1D00010
    unseen.look(["/a"])
    assert unseen.searching and unseen.own_mark == 0xC1D00021
    assert unseen.mark_to_write == 0xC1D00010
    while unseen.searching:
        unseen.advance(1.0)
    assert unseen.mark_to_write == 0xC1D00021
    # A daemon stopped while it searched has not searched the gap: the mark it was given.
    stopped = Node_()
    stopped.rm.add_process(trace_tracker(PID).processes[PID])
    short = stopped.unseen()
    short.look(["/a"])
    assert short.searching
    short.close()
    assert short.mark_to_write == 0xC1D00010
    # A quiet node, and the first daemon on it (no mark given): its own client at once.
    quiet = Node_()
    quiet.members = {}
    quiet.mark = None
    first = quiet.unseen()
    assert first.mark_to_write is None
    first.look(["/a"])
    assert first.mark_to_write == 0xC1D00021
    # No client could be made (no /dev/nvidiactl): the mark given is left, not one a tenant made.
    blind = UnseenProcesses(
        lambda: Tracker(),
        lambda: Path("/sys/fs/cgroup"),
        lambda pid: 55,
        lambda: 0.0,
        newest=lambda: None,
        members=lambda root, pod: [],
    )
    blind.mark = 0xC1D00010
    blind.look(["/a"])
    assert blind.own_mark is None and blind.mark_to_write == 0xC1D00010


def test_with_client_checks_the_first_daemon_searches_every_client_handle_silently() -> None:
    """No mark (the first daemon on a node): asking every client handle would write a log line
    per missing one (call 23H). Checked by making a client at each (rmctl.ClientCheck), the
    missing ones are not asked: the whole range, newest first, and nothing logged."""
    node = Node_()
    node.mark = None
    node.checks = True
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    unseen.look(["/a"])
    assert unseen.status()["searching"] == [PID]
    while unseen.searching:
        unseen.advance(1.0)
    (group,) = node.tracker.channel_groups(PID)
    assert group.client == 0xC1D0001B and governable(node.tracker, PID)
    assert node.rm.logged == 0 and unseen.refusals.spent == 0
    # From just below the client it made (0x21) down to the trace's 0x1b.
    assert node.rm.checked == 0x20 - 0x1B + 1
    status = unseen.status()
    assert (status["clients_checked"], status["refusals"]) == (node.rm.checked, 0)
    unseen.close()
    assert node.rm.check_closed


def test_handles_found_free_are_checked_once_for_all_the_searches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two processes started before the daemon, 200 clients freed after them: each search asks
    the same range, and the second need not check what the first found free."""
    monkeypatch.setattr(discover, "CLIENT_HANDLE_COUNT", 2048)
    node = Node_()
    node.checks = True
    node.mark = 0xC1D00010
    first = trace_tracker(PID).processes[PID]
    node.rm.add_process(first)
    other = 5151
    node.rm.add(other, 8, 0xC1D0001F, {0x5C000002: (0x80, 0xC1D0001F)})
    node.members["/a"] = [PID, other]
    node.files[other] = {8: Node.CTL}
    node.started[other] = 778
    node.cuda.add(other)
    checked: list[int] = []
    held = node.rm.in_use

    def in_use(handle: int) -> bool | None:
        checked.append(handle)
        return held(handle)

    node.rm.in_use = in_use  # type: ignore[method-assign]
    unseen = node.unseen()
    newest = 0xC1D00021 + 200
    unseen._newest = lambda: newest
    unseen.look(["/a"])
    while unseen.searching:
        unseen.advance(1.0)
    assert governable(node.tracker, PID)
    # The other process holds no channels: its search runs through every client handle, past
    # the mark, from 0xe8 (just below the one made) round to 0xea. Each free one was checked
    # once, whichever search reached it first; the three held (0x1f, 0x1d, 0x1b) by each search
    # that reached them.
    free = [h for h in checked if h not in node.rm.clients]
    assert len(free) == len(set(free)) == (discover.CLIENT_HANDLE_COUNT - 1) - 3
    assert len(checked) - len(free) == 3 + 3
    assert node.rm.logged == 0


@pytest.mark.parametrize("checks", [True, False])
def test_a_process_older_than_the_mark_is_found_below_it_where_handles_can_be_checked(
    monkeypatch: pytest.MonkeyPatch, checks: bool
) -> None:
    """The last daemon's mark is newer than the process: it started before that daemon's probe,
    and its pod was configured only after that daemon's first look (annotations added to a
    running deployment), so that daemon never searched it. Checked handles cost no log line: the
    search goes on below the mark and finds it. Without checks each missing handle below the
    mark would write one: the search stops at the mark, and the process is reported."""
    monkeypatch.setattr(discover, "CLIENT_HANDLE_COUNT", 2048)
    node = Node_()
    node.checks = checks
    node.mark = 0xC1D0001E  # after the trace's clients (0x1b, 0x1d)
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen()
    unseen.look(["/a"])
    while unseen.searching:
        unseen.advance(1.0)
    assert governable(node.tracker, PID) is checks
    assert unseen.status()["not_found"] == ([] if checks else [PID])
    # Without checks, the two handles above the mark (0x20, 0x1f), missing, were asked.
    assert node.rm.logged == (0 if checks else 2 * 3)


def looked(unseen: UnseenProcesses, node: Node_, pods: list[str]) -> int:
    """Refreshes, a tick apart, until the look started by the first has ended; how many."""
    refreshes = 0
    while True:
        unseen.refresh(lambda: pods)
        refreshes += 1
        if not unseen.looking:
            return refreshes
        node.now += 0.1


def test_a_look_through_a_tenants_many_cgroups_works_in_slices() -> None:
    """A pod's cgroups are its tenant's to make (5 000 held the daemon's loop 266 ms a look, in
    one go): a look lists a few a refresh, at most LOOK_SLICE_S of it, keeps what the last look
    found meanwhile, and makes the mark it leaves only once it has looked through them all."""
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    listed = [0]  # cgroups listed, by refresh
    made: list[int] = []

    def members(root: Path, pod: str) -> Iterator[list[int]]:
        for index in range(400):
            listed[-1] += 1
            yield [PID] if index == 399 else []

    def newest() -> int:
        made.append(0xC1D00021)
        return made[-1]

    unseen = node.unseen(members=members, timer=Stepping(0.0005), newest=newest)
    refreshes = 0
    while True:
        unseen.refresh(lambda: ["/a"])
        refreshes += 1
        if not unseen.looking:
            break
        assert unseen.unseen == {} and not unseen.searching and made == []
        assert unseen.mark_to_write == 0xC1D00010 and unseen.status()["look"]["looking"]
        listed.append(0)
        node.now += 0.1
    # Four or five cgroups a refresh (a reading of the timer each, 0.5 ms apart, to 2 ms).
    assert max(listed) <= 5 and sum(listed) == 400 and refreshes >= 80
    assert unseen.unseen == {"/a": [PID]} and unseen.searching and made == [0xC1D00021]
    look = unseen.status()["look"]
    assert look["cgroups"] == 400 and not look["looking"]
    assert look["ms"] == pytest.approx(1e3 * unseen.look_cost_s, abs=0.01)
    assert 0.2 <= unseen.look_cost_s <= 0.3  # a reading a cgroup, two a slice
    while unseen.searching:
        unseen.advance(1.0)
    assert governable(node.tracker, PID) and unseen.mark_to_write == 0xC1D00021


def test_a_process_in_a_deep_cgroup_of_a_wide_pod_is_found_a_few_cgroups_a_refresh(
    tmp_path: Path,
) -> None:
    """The real walk (gpuprocs.cgroup_procs) gives a look each cgroup, the empty ones too: a
    pod of 300 empty cgroups and one process at the bottom is listed over many refreshes."""
    pod = tmp_path / "pod"
    for index in range(300):
        leaf = pod / f"group{index // 30}" / f"leaf{index}"
        leaf.mkdir(parents=True)
        (leaf / "cgroup.procs").write_text("")
    (pod / "group9" / "leaf299" / "deeper").mkdir()
    (pod / "group9" / "leaf299" / "deeper" / "cgroup.procs").write_text(f"{PID}\n")
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    unseen = node.unseen(
        members=lambda root, name: cgroup_procs(tmp_path, name), timer=Stepping(0.0005)
    )
    assert looked(unseen, node, ["/pod"]) >= 300 // 5
    assert unseen.unseen == {"/pod": [PID]} and unseen.searching
    assert unseen.status()["look"]["cgroups"] == 1 + 10 + 300 + 1


@pytest.mark.parametrize(("cgroups", "step", "spaced"), [(3, 1e-5, False), (400, 0.0005, True)])
def test_looks_start_every_ten_seconds_or_spaced_to_a_share_of_a_core(
    cgroups: int, step: float, spaced: bool
) -> None:
    """A look that cost more than LOOK_SHARE of LOOK_EVERY_S starts the next one as long after
    its own start as keeps looks at that share: a tenant's cgroups cost the loop 1 % of a core
    at most, however many."""
    node = Node_()
    node.members = {}
    starts: list[tuple[float, float]] = []  # when a look started, what the last one cost

    def members(root: Path, pod: str) -> Iterator[list[int]]:
        starts.append((node.now, unseen.look_cost_s))
        yield from ([] for _ in range(cgroups))

    unseen = node.unseen(members=members, timer=Stepping(step))
    while node.now < 120:
        unseen.refresh(lambda: ["/a"])
        node.now = round(node.now + 0.1, 6)
    every = max(LOOK_EVERY_S, unseen.look_cost_s / LOOK_SHARE)
    assert (every > LOOK_EVERY_S) is spaced and unseen.status()["look"]["spaced"] is spaced
    assert unseen.status()["look"]["every_s"] == round(every, 1)
    assert len(starts) >= 4
    for (before, _), (start, cost) in itertools.pairwise(starts):
        # On the tick grid: at the first refresh the last look's cost allows.
        wait = max(LOOK_EVERY_S, cost / LOOK_SHARE)
        assert wait <= start - before < wait + 0.1 + 1e-6, (start - before, cost)


def test_while_a_second_look_runs_the_mark_left_is_the_first_looks() -> None:
    """A finished look's mark holds while the next one walks (the processes before it were
    found and searched); the next look's own replaces it once that look has ended."""
    node = Node_()
    node.members = {}
    newest = [0xC1D00021]
    cgroups = [1]

    def members(root: Path, pod: str) -> Iterator[list[int]]:
        yield from ([] for _ in range(cgroups[0]))

    unseen = node.unseen(members=members, timer=Stepping(0.0005), newest=lambda: newest[0])
    looked(unseen, node, ["/a"])
    assert unseen.mark_to_write == 0xC1D00021
    newest[0], cgroups[0] = 0xC1D00040, 100
    node.now += LOOK_EVERY_S
    unseen.refresh(lambda: ["/a"])
    assert unseen.looking and unseen.mark_to_write == 0xC1D00021
    looked(unseen, node, ["/a"])
    assert unseen.mark_to_write == 0xC1D00040
    # Closed amid a look, the last finished look's mark stays the one to leave.
    newest[0] = 0xC1D00050
    node.now += 2 * LOOK_EVERY_S
    unseen.refresh(lambda: ["/a"])
    assert unseen.looking
    unseen.close()
    assert not unseen.looking and unseen.mark_to_write == 0xC1D00040


def test_the_bench_times_looks_through_a_tenants_tree_whole_and_in_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench unseen` on a small tree: both ways list every cgroup of the 100 pods, the
    slices hold a refresh for less than the whole look, and the rows carry what the targets are
    judged on."""
    from tools.bench import unseen as bench

    monkeypatch.setattr(bench, "SECONDS", 30)
    root = tmp_path / "tenant"
    small_tenant_tree(root, monkeypatch, 1500)
    whole, sliced = bench.measure(root, sliced=False), bench.measure(root, sliced=True)
    # The 100 pods' cgroups and 3 containers each, the tenant's 1 500 and its 15 groups.
    assert whole["cgroups"] == sliced["cgroups"] == 100 * 4 + 1500 + 15
    assert whole["looks"] == 3 and 1 <= sliced["looks"] <= 3
    assert sliced["longest_refresh_ms"] < whole["longest_refresh_ms"]
    for row in (whole, sliced):
        assert row["cpu_percent"] > 0 and row["look_ms"] > 0


def test_a_process_found_while_a_later_look_walks_is_not_listed_unseen_by_it() -> None:
    """A look's slices can span seconds: a process it checked early (not governed then) and a
    search found before the look ended is governed, so that look neither lists it as unseen
    nor searches it again."""
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    cgroups = [1]

    def members(root: Path, pod: str) -> Iterator[list[int]]:
        yield [PID]  # the process's cgroup first, then the rest of the pod's
        yield from ([] for _ in range(cgroups[0]))

    unseen = node.unseen(members=members, timer=Stepping(0.0005))
    unseen.look(["/a"])
    assert unseen.unseen == {"/a": [PID]} and unseen.searching
    cgroups[0] = 100
    unseen.start_look(["/a"])
    assert not unseen.continue_look(0.002)  # the process checked; the look goes on
    while unseen.searching:
        unseen.advance(1.0)
    assert governable(node.tracker, PID) and unseen.unseen == {}
    while not unseen.continue_look(0.002):
        pass
    assert unseen.unseen == {} and not unseen.searching and node.searches == [PID]


def test_a_search_takes_the_descriptors_a_process_holds_when_it_starts() -> None:
    """The look lists a process's descriptors when it checks it, perhaps seconds before the look
    ends; one closed since may name another file by then. The search, which sends RM's controls
    through each, takes them as they are when it starts."""
    node = Node_()
    node.rm.add_process(trace_tracker(PID).processes[PID])
    borrowed: list[int] = []

    def askers(pid: int, fd: int) -> tuple[discover.Asker, Callable[[], None]]:
        borrowed.append(fd)
        return node.rm.asker(pid, fd)

    def members(root: Path, pod: str) -> Iterator[list[int]]:
        yield [PID]
        yield from ([] for _ in range(100))

    unseen = node.unseen(members=members, askers=askers, timer=Stepping(0.0005))
    unseen.start_look(["/a"])
    assert not unseen.continue_look(0.002) and node.files_read == [PID]
    del node.files[PID][17]  # closed while the look went on
    while not unseen.continue_look(0.002):
        pass
    assert node.files_read == [PID, PID] and unseen.searching
    while unseen.searching:
        unseen.advance(1.0)
    assert borrowed and 17 not in borrowed and governable(node.tracker, PID)
