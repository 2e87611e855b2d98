"""A restarted daemon adopts the RM handles its predecessor learnt: written, read back, and each
object checked against what RM still holds (stand-ins for RM, pidfd_getfd and /proc)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from qpolicy.backends import rm as rm_backend
from qpolicy.backends.base import BackendContext
from qpolicy.backends.rm import RmBackend
from qpolicy.enforcers.rm import handles, unseen
from qpolicy.enforcers.rm.handles import HANDLES_NAME, HandleBook, adopt, dump
from qpolicy.model import GpuConfig, GpuPolicy, PodSpec
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.abi import Node
from qpolicy.nvrm.records import Record
from qpolicy.nvrm.replay import builtin_records
from qpolicy.nvrm.tracker import Tracker
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.state import DesiredState
from qpolicy.telemetry.cgroups import CgroupMap, cgroup_of_process
from qpolicy.telemetry.probesource import ProbeSource
from tests.unit.rm_double import RmDouble
from tests.unit.test_telemetry_live import FakeProbe, process, rm_alloc

PID = 4321
STARTED = 777


def traced() -> Tracker:
    """The shipped H200 trace's process (PyTorch's matmul) as pid PID, still running."""
    tracker = Tracker()
    for record in builtin_records():
        if record.kind != "exit":
            tracker.feed(dataclasses.replace(record, pid=PID, cgroup=55))
    return tracker


class Rm:
    """What RM holds: each (client, handle) and its class, as the first tracker learnt them."""

    def __init__(self, tracker: Tracker) -> None:
        self.held = {
            (client.handle, obj.handle): obj.cls
            for proc in tracker.processes.values()
            for client in proc.clients.values()
            for obj in client.objects.values()
        }
        self.asked: list[tuple[int, int]] = []
        self.borrowed: list[int] = []

    def borrow(self, pid: int, fd: int) -> int:
        mine = os.open("/dev/null", os.O_RDONLY)
        self.borrowed.append(mine)
        return mine

    def class_of(self, fd: int, client: int, handle: int) -> int | None:
        self.asked.append((client, handle))
        return self.held.get((client, handle))


def write(state: Path, tracker: Tracker, start: int = STARTED) -> None:
    (state / HANDLES_NAME).write_text(json.dumps(dump(tracker, lambda pid: start)))


def adopt_into(state: Path, rm: Rm, start: int | None = STARTED) -> tuple[Tracker, object]:
    tracker = Tracker()
    adoption = adopt(
        state,
        tracker,
        lambda pid: 99,
        borrow=rm.borrow,
        class_of=rm.class_of,
        start_time=lambda pid: start,
        is_nvidia=lambda fd: True,
    )
    return tracker, adoption


def test_a_process_rm_still_holds_is_adopted_whole(tmp_path: Path) -> None:
    first = traced()
    write(tmp_path, first)
    rm = Rm(first)
    second, adoption = adopt_into(tmp_path, rm)
    # The channel groups the enforcer closes and the TSGs it sets, as the first daemon knew them;
    # only the cgroup is read again (the process may have moved).
    want = [dataclasses.replace(g, cgroup=99) for g in first.channel_groups(PID)]
    assert second.channel_groups(PID) == want and want[0].channels and want[0].compute_tsgs
    assert second.compute_channels(PID) == first.compute_channels(PID)
    assert second.summary(PID).device_bytes == first.summary(PID).device_bytes > 0
    assert second.summary(PID).tsgs == 4 and second.processes[PID].fds
    # No mark was written (the clients a tenant made are none: see the mark's test).
    assert adoption == handles.Adoption(1, 20, 172, 0, (), None)
    # Every object was asked of RM, through descriptors that were closed again.
    assert len(rm.asked) == 172
    for fd in rm.borrowed:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_objects_rm_no_longer_holds_are_dropped_with_what_hangs_below_them(
    tmp_path: Path,
) -> None:
    first = traced()
    write(tmp_path, first)
    rm = Rm(first)
    (group,) = first.channel_groups(PID)
    freed_tsg = group.tsgs[1]
    del rm.held[(group.client, freed_tsg)]  # freed while no daemon ran: its channels went too
    reused = group.channels[0]
    rm.held[(group.client, reused)] = 0x40  # the handle now names vidmem
    second, adoption = adopt_into(tmp_path, rm)
    (kept,) = second.channel_groups(PID)
    assert freed_tsg not in kept.tsgs and reused not in kept.channels
    below = {
        obj.handle
        for obj in first.processes[PID].clients[group.client].objects.values()
        if obj.parent == freed_tsg
    }
    assert below and not below & set(kept.channels)
    assert set(kept.channels) == set(group.channels) - below - {reused}
    assert isinstance(adoption, handles.Adoption) and adoption.dropped > len(below) + 1


@pytest.mark.parametrize(
    ("case", "expected"),
    [("exited or pid reused", 0), ("fd closed", 0), ("fd names another file", 0)],
)
def test_a_process_that_is_gone_or_whose_file_is_not_adopted(
    tmp_path: Path, case: str, expected: int
) -> None:
    first = traced()
    write(tmp_path, first)
    rm = Rm(first)
    tracker = Tracker()

    def refuse(pid: int, fd: int) -> int:
        raise rmctl.RmError(f"cannot take fd {fd} of process {pid}: Bad file descriptor")

    adoption = adopt(
        tmp_path,
        tracker,
        lambda pid: 99,
        borrow=refuse if case == "fd closed" else rm.borrow,
        class_of=rm.class_of,
        start_time=lambda pid: STARTED + (case == "exited or pid reused"),
        is_nvidia=lambda fd: case != "fd names another file",
    )
    assert adoption.processes == expected and tracker.processes == {}
    assert rm.asked == [] and adoption.problems == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "cannot read"),
        ("[]", "not a handle file"),
        ('{"version": 7, "processes": []}', "not a handle file"),
        ('{"version": 1, "processes": {}}', "not a handle file"),
        ('{"version": 1, "processes": [{"pid": "1"}]}', "malformed entry"),
        ('{"version": 1, "processes": [5]}', "malformed entry"),
        (
            '{"version": 1, "processes": [{"pid": 1, "start_time": 777, "clients": '
            '[{"handle": 1, "fd": 5, "objects": [[1, 65, null, 0, 0]]}]}]}',
            "malformed entry",
        ),
    ],
)
def test_a_damaged_handle_file_is_reported_never_raised(
    tmp_path: Path, text: str, problem: str
) -> None:
    (tmp_path / HANDLES_NAME).write_text(text)
    tracker, adoption = adopt_into(tmp_path, Rm(Tracker()))
    assert isinstance(adoption, handles.Adoption)
    assert len(adoption.problems) == 1 and problem in adoption.problems[0]
    assert adoption.processes == 0 and tracker.processes == {}


def test_the_book_writes_when_the_handles_changed_at_most_once_a_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = traced()
    now = [0.0]
    path = tmp_path / HANDLES_NAME
    book = HandleBook(path, tracker, lambda: now[0], start_time=lambda pid: STARTED)

    def change() -> None:
        tracker.changed("alloc", 55, tracker.processes[PID])

    book.maybe_write()
    assert json.loads(path.read_text())["processes"][0]["pid"] == PID
    assert book.writes == 1
    path.unlink()
    now[0] = 5.0
    book.maybe_write()  # nothing changed: nothing written
    assert not path.exists()
    change()
    now[0] = 5.5
    book.maybe_write()  # changed, but written 5 s ago: now
    assert path.exists()
    path.unlink()
    change()
    now[0] = 5.9
    book.maybe_write()  # changed, written 0.4 s ago: later
    assert not path.exists()
    now[0] = 6.6
    book.maybe_write()
    assert path.exists()
    assert book.writes == 3  # the writes that happened, and only those
    assert book.writes_why == {"first": 1, "tracker": 2}
    # A write that fails is said once, and the daemon goes on.
    broken = HandleBook(tmp_path / "gone" / HANDLES_NAME, tracker, lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            change()
            now[0] += 2
            broken.maybe_write()
    assert [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()] == [
        caplog.records[0].getMessage()
    ]


def test_a_process_that_came_and_went_between_two_writes_writes_nothing(tmp_path: Path) -> None:
    """Calls 55C and 55D (H100s): with ten steady pods, all that changed the tracker was a check
    of the host's own, a process every 5 s that opened the GPU, made a few objects and exited,
    often within one refresh; each such process rewrote the file with what it held already."""
    tracker = traced()
    now = [0.0]
    path = tmp_path / HANDLES_NAME
    book = HandleBook(path, tracker, lambda: now[0], start_time=lambda pid: STARTED)

    def pids() -> list[int]:
        return [p["pid"] for p in json.loads(path.read_text())["processes"]]

    book.maybe_write()
    path.unlink()
    for record in process(99, 7, tsgs=1, channels_per_tsg=1, vidmem=0):
        tracker.feed(record)
    tracker.feed(Record("exit", 0, 99, pid=99))
    now[0] = 2.0
    book.maybe_write()
    assert not path.exists()
    assert (book.writes, book.unchanged) == (1, 1)
    book.maybe_write()  # compared once: nothing changed since
    assert book.unchanged == 1
    # One that lives is written; and so is its exit.
    for record in process(98, 7, tsgs=1, channels_per_tsg=1, vidmem=0):
        tracker.feed(record)
    now[0] = 4.0
    book.maybe_write()
    assert pids() == [PID, 98]
    tracker.feed(Record("exit", 0, 98, pid=98))
    now[0] = 6.0
    book.maybe_write()
    assert pids() == [PID]
    # A change to a process written is written, whatever came and went beside it.
    path.unlink()
    tracker.feed(rm_alloc(PID, 55, 0xBEEF, 0xC1D00001, 0x40), node=Node.GPU)
    for record in process(97, 7, tsgs=1, channels_per_tsg=1, vidmem=0):
        tracker.feed(record)
    tracker.feed(Record("exit", 0, 97, pid=97))
    now[0] = 8.0
    book.maybe_write()
    assert pids() == [PID]
    assert book.writes_why == {"first": 1, "tracker": 3}


def test_the_cgroup_of_a_process_is_read_from_proc(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "kubepods.slice" / "pod" / "ctr").mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("0::/kubepods.slice/pod/ctr\n")
    (proc / "8").mkdir()
    (proc / "8" / "cgroup").write_text("0::/kubepods.slice/removed\n")
    expected = os.stat(root / "kubepods.slice" / "pod" / "ctr").st_ino
    assert cgroup_of_process(7, root, proc) == expected
    assert cgroup_of_process(8, root, proc) is None
    assert cgroup_of_process(9, root, proc) is None


def node_of_pid_10(
    monkeypatch: pytest.MonkeyPatch, cgroups: CgroupMap, newest: Callable[[], int]
) -> None:
    """The node as a backend's searches see it: pid 10 in pod /a, with one control descriptor
    and libcuda, started at STARTED; RM numbers the client a daemon makes ``newest()``; no
    client handle can be checked without a question (the old way: refusals counted)."""
    monkeypatch.setattr(unseen, "nvidia_files", lambda pid: {5: Node.CTL} if pid == 10 else {})
    monkeypatch.setattr(unseen, "process_start_time", lambda pid: STARTED if pid == 10 else None)
    monkeypatch.setattr(rmctl, "newest_client_handle", newest)
    monkeypatch.setattr(unseen, "maps_libcuda", lambda pid: True)
    monkeypatch.setattr(unseen, "process_running", lambda pid, started: True)
    monkeypatch.setattr(unseen, "open_client_check", lambda: None)
    monkeypatch.setattr(handles, "process_start_time", lambda pid: STARTED if pid == 10 else None)
    monkeypatch.setattr(rm_backend, "cgroup_of_process", lambda pid, root: cgroups.id_of("/a"))


def test_a_restarted_backend_governs_the_processes_its_predecessor_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemon one sees pid 10 allocate and stops; daemon two's probe sees nothing of it, yet
    knows its channels (checked against RM) and does not call it unseen."""
    cgroup = tmp_path / "cgroup"
    (cgroup / "a").mkdir(parents=True)
    (cgroup / "a" / "cgroup.procs").write_text("10\n")
    cgroups = CgroupMap(root=cgroup)
    node_of_pid_10(monkeypatch, cgroups, lambda: 0xC1D00002)
    state = tmp_path / "state"

    rm = RmDouble()

    def backend(records: list[object]) -> tuple[RmBackend, ProbeSource]:
        probe = FakeProbe()
        probe.pending = records  # type: ignore[assignment]
        source = ProbeSource(probe, cgroups)
        context = BackendContext(RealtimeLoop(), source, state, lambda: cgroup, lambda: 0.0)
        made = RmBackend(context, gpus=list, askers=rm.asker)  # type: ignore[arg-type]
        made._state = DesiredState(  # what sync would set, without starting a control loop
            gpus={0: GpuConfig(0, GpuPolicy.FIXED_SHARE)}, pods={"/a": PodSpec("/a", 0, share=50)}
        )
        source.refresh()
        return made, source

    one, seen = backend(process(10, cgroups.id_of("/a"), tsgs=2, channels_per_tsg=3, vidmem=0))
    groups = seen.view.tracker.channel_groups(10)
    assert len(groups[0].channels) == 6
    one.close()  # writes what it knows
    assert one.status()["handle_writes"] == one.handles.writes == 1
    assert one.status()["handle_writes_why"] == {"close": 1}
    assert one.status()["handle_unchanged"] == 0
    changes = one.status()["tracker_changes"]
    tree = seen.view.tracker.changes
    assert changes["by_cause"] == dict(tree) and tree["alloc"] > 0
    assert changes["busiest"] == [{"cgroup": "/a", "changes": sum(tree.values())}]
    # A cgroup whose path was never learnt (removed since) is shown by its id, and the status,
    # written every second, does not walk the hierarchy to look for it.
    seen.view.tracker.changes_by_cgroup[987654321] = 1
    walked = cgroups._walked_at
    assert one.status()["tracker_changes"]["busiest"][-1] == {"cgroup": "987654321", "changes": 1}
    assert cgroups._walked_at == walked
    held = Rm(seen.view.tracker)
    monkeypatch.setattr(rmctl, "borrow_fd", held.borrow)
    monkeypatch.setattr(rmctl, "handle_class", held.class_of)
    monkeypatch.setattr(handles, "_is_nvidia", lambda fd: True)
    two, unseeing = backend([])
    try:
        assert unseeing.view.tracker.channel_groups(10) == groups
        assert two.status()["adopted"] == {
            "processes": 1,
            "channels": 6,
            "objects": len(held.asked),
            "dropped": 0,
            "problems": [],
        }
        two.refresh()
        while two.unseen_processes.looking:
            two.refresh()
        assert two.unseen == {} and two.status()["searched"]["look"]["cgroups"] > 0
    finally:
        two.close()
    # Without the handles a previous daemon wrote, the same process is found by asking RM about
    # the clients made since the last one that daemon saw made (its mark, kept in the file).
    (state / HANDLES_NAME).write_text(
        json.dumps({"version": 1, "newest_client": 0xC1D00000, "processes": []})
    )
    rm.add_process(seen.view.tracker.processes[10])
    three, blind = backend([])
    try:
        assert blind.view.tracker.channel_groups(10) == []
        three.refresh()
        assert three.status()["adopted"]["processes"] == 0
        while three.unseen_processes.looking or three.unseen_processes.searching:
            three.refresh()
        (found,) = blind.view.tracker.channel_groups(10)
        assert (found.client, found.channels, found.tsgs, found.subdevice) == (
            groups[0].client,
            groups[0].channels,
            groups[0].tsgs,
            groups[0].subdevice,
        )
        assert three.unseen == {}
        assert three.status()["searched"]["found_processes"] == 1
    finally:
        three.close()
    assert rm.open == set()


def test_the_mark_is_what_the_daemon_vouches_for_and_a_change_of_it_is_written(
    tmp_path: Path,
) -> None:
    """The file's mark is the one the backend gives the book (UnseenProcesses.mark_to_write), not
    the newest client the probe saw made: a tenant may name its client's handle, and RM's counter
    does not follow it (rs_server.c, _serverCreateEntryAndLockForNewClient)."""
    tracker = Tracker()
    tracker.feed(rm_alloc(1, 5, 0xC1D7FFFF, 0, 0x41), node=Node.CTL)  # a tenant's chosen handle
    assert dump(tracker, lambda pid: 1)["newest_client"] is None
    assert dump(tracker, lambda pid: 1, 0xC1D00002)["newest_client"] == 0xC1D00002
    clock = [0.0]
    mark = [0xC1D00002]
    book = HandleBook(
        tmp_path / HANDLES_NAME, tracker, lambda: clock[0], lambda pid: 1, mark=lambda: mark[0]
    )
    book.maybe_write()
    written = json.loads((tmp_path / HANDLES_NAME).read_text())
    assert written["newest_client"] == 0xC1D00002

    def written_mark() -> int:
        return int(json.loads((tmp_path / HANDLES_NAME).read_text())["newest_client"])

    # The mark alone moved on (each look for unseen processes makes a client): the older one
    # written is still true, so it is rewritten only once a minute.
    mark[0] = 0xC1D00009
    clock[0] += handles.WRITE_EVERY_S
    book.maybe_write()
    assert written_mark() == 0xC1D00002
    assert book.unchanged == 1  # put off, and not looked at again every tick until due
    clock[0] = handles.NEWER_MARK_EVERY_S - 0.1
    book.maybe_write()
    assert written_mark() == 0xC1D00002
    assert book.unchanged == 1
    clock[0] = handles.NEWER_MARK_EVERY_S
    book.maybe_write()
    assert written_mark() == 0xC1D00009
    assert book.writes_why == {"first": 1, "mark": 1}
    # With the tracker changed it goes with the tracker's write, a second later.
    mark[0] = 0xC1D0000B
    tracker.changed("alloc", 5, tracker.processes[1])
    clock[0] += handles.WRITE_EVERY_S
    book.maybe_write()
    assert written_mark() == 0xC1D0000B
    # A mark that goes back (a search of a gap started) is no longer true of the file: written
    # a second later, not a minute.
    mark[0] = 0xC1D00009
    clock[0] += handles.WRITE_EVERY_S
    book.maybe_write()
    assert written_mark() == 0xC1D00009
    assert book.writes_why == {"first": 1, "mark": 2, "tracker": 1}
    # The next daemon reads it back (an older file without it gives no mark).
    assert adopt(tmp_path, Tracker(), lambda pid: None).newest_client == 0xC1D00009
    written.pop("newest_client")
    (tmp_path / HANDLES_NAME).write_text(json.dumps(written))
    assert adopt(tmp_path, Tracker(), lambda pid: None).newest_client is None


def test_a_process_started_between_two_daemons_on_a_quiet_node_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Call 24A (an H200): a daemon ran 3 s on a node where no client was made, and stopped; the
    trainers started; the next daemon found no mark and left them ungoverned (0.50 of 0.70). A
    daemon's mark is a client it makes itself: every client made after it, its probe saw."""
    cgroup = tmp_path / "cgroup"
    (cgroup / "a").mkdir(parents=True)
    procs = cgroup / "a" / "cgroup.procs"
    procs.write_text("")
    cgroups = CgroupMap(root=cgroup)
    newest = [0xC1D00000]  # what RM numbers the client a daemon makes now
    node_of_pid_10(monkeypatch, cgroups, lambda: newest[0])
    state = tmp_path / "state"
    rm = RmDouble()
    clock = [0.0]

    def backend() -> tuple[RmBackend, ProbeSource]:
        source = ProbeSource(FakeProbe(), cgroups)
        context = BackendContext(RealtimeLoop(), source, state, lambda: cgroup, lambda: clock[0])
        made = RmBackend(context, gpus=list, askers=rm.asker)  # type: ignore[arg-type]
        made._state = DesiredState(  # what sync would set, without starting a control loop
            gpus={0: GpuConfig(0, GpuPolicy.FIXED_SHARE)}, pods={"/a": PodSpec("/a", 0, share=50)}
        )
        return made, source

    def mark() -> int | None:
        value = json.loads((state / HANDLES_NAME).read_text())["newest_client"]
        return value if value is None else int(value)

    # Daemon one: nothing runs, no client is made; it stops after 3 s.
    one, _ = backend()
    for _ in range(30):
        one.refresh()
        clock[0] += 0.1
    one.close()
    assert mark() == 0xC1D00000  # its own client: the first daemon leaves a mark
    # The trainer starts while no daemon runs: its client is 0xc1d00001; monitoring made and
    # freed three more before the next daemon.
    trainer = FakeProbe()
    trainer.pending = process(10, cgroups.id_of("/a"), tsgs=2, channels_per_tsg=3, vidmem=0)
    traced = ProbeSource(trainer, cgroups)
    traced.refresh()
    rm.add_process(traced.view.tracker.processes[10])
    procs.write_text("10\n")
    newest[0] = 0xC1D00005
    # Daemon two is stopped in its first search: the gap is not searched, so the mark it leaves
    # is the one it was given, not its own.
    monkeypatch.setattr(rm_backend, "SEARCH_SHARE", 0.0)
    two, _ = backend()
    two.refresh()
    while two.unseen_processes.looking:  # a look works in slices (unseen.LOOK_SLICE_S)
        two.refresh()
    assert two.unseen_processes.searching
    two.close()
    assert mark() == 0xC1D00000
    # Daemon three searches the gap to its end and governs the trainer; then its own client is
    # the mark.
    monkeypatch.setattr(rm_backend, "SEARCH_SHARE", 1.0)
    monkeypatch.setattr(rm_backend, "SEARCH_MOST_S", 1.0)
    newest[0] = 0xC1D00007
    three, blind = backend()
    try:
        three.refresh()
        while three.unseen_processes.looking or three.unseen_processes.searching:
            three.refresh()
        (found,) = blind.view.tracker.channel_groups(10)
        assert (found.client, len(found.channels)) == (0xC1D00001, 6)
        assert three.unseen == {}
        # Asked from just below its own client down to the mark: 0xc1d00006-2 refused (two
        # daemons), 0xc1d00001 found.
        assert rm.refusals[0x23] == 3 + 5
        clock[0] += handles.WRITE_EVERY_S
        three.refresh()
        assert mark() == 0xC1D00007
    finally:
        three.close()
    assert mark() == 0xC1D00007
    assert rm.open == set()


def test_searches_get_a_share_of_the_time_however_often_the_backend_refreshes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refreshes run with whatever wakes the loop: a fixed slice per refresh took 8-10 % of a
    core while searching, not 5 (an H200, call 24E)."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    clock = [100.0]
    context = BackendContext(
        RealtimeLoop(), ProbeSource(FakeProbe(), CgroupMap(root=cgroup)), tmp_path / "state",
        lambda: cgroup, lambda: clock[0],
    )  # fmt: skip
    monkeypatch.setattr(unseen, "open_client_check", lambda: None)
    backend = RmBackend(context, gpus=list)
    given: list[float] = []
    searching = [True]
    monkeypatch.setattr(
        type(backend.unseen_processes), "searching", property(lambda s: searching[0])
    )
    monkeypatch.setattr(backend.unseen_processes, "advance", given.append)
    try:
        for step in (0.0, 0.05, 0.05, 0.1, 10.0):
            clock[0] += step
            backend.refresh()
        searching[0] = False
        clock[0] += 5.0
        backend.refresh()  # nothing to search: the next search starts afresh
        searching[0] = True
        clock[0] += 0.02
        backend.refresh()
    finally:
        backend.close()
    assert given == pytest.approx([0.005, 0.0025, 0.0025, 0.005, 0.01, 0.005])


def test_the_book_compares_the_processes_that_dump_writes(tmp_path: Path) -> None:
    """The book decides on what :func:`dump` would write without dumping: the same processes (a
    process with clients on known files), no more and no fewer, or a change would be missed or
    written for nothing."""
    tracker = traced()
    for record in process(98, 7, tsgs=1, channels_per_tsg=1, vidmem=0):
        tracker.feed(record)
    # Objects seen under a client whose making was not: a stand-in client with no file.
    tracker.feed(rm_alloc(97, 7, 0xD0, 0xC1D00001, 0x80), node=Node.CTL)
    tracker.feed(Record("open", 0, 96, ret=5, s="/dev/nvidiactl", pid=96, cgroup=7))  # no client
    assert {97, 96} <= set(tracker.processes)
    book = HandleBook(tmp_path / HANDLES_NAME, tracker, lambda: 0.0, start_time=lambda pid: 1)
    written = {p["pid"] for p in dump(tracker, lambda pid: 1)["processes"]}
    assert {pid for pid, _ in book._processes()} == written == {PID, 98}
