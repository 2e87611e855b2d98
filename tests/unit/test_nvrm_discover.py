"""Finding a process's RM objects by asking RM handle by handle (qpolicy.nvrm.discover), against
a double of RM's answers (tests/unit/rm_double.py) holding the shipped H200 trace's objects."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import struct
from typing import Any

import pytest

from qpolicy.nvrm import abi, discover, rmctl
from qpolicy.nvrm.abi import Kind, Node
from qpolicy.nvrm.tracker import ProcessState, Tracker
from tests.unit.rm_double import RmDouble, traced_process

PID = 4321
CTL_FILES = {8: Node.CTL, 11: Node.GPU, 15: Node.CTL, 17: Node.CTL, 9: Node.UVM}


def traced() -> ProcessState:
    return traced_process(PID)


def tree(proc: ProcessState) -> dict[int, dict[int, tuple[int, int | None]]]:
    return {
        c.handle: {o.handle: (o.cls, o.parent) for o in c.objects.values()}
        for c in proc.clients.values()
    }


MARK = 0xC1D00010  # the newest client a daemon saw made before the trace's process started


def searcher(
    rm: RmDouble,
    fds: dict[int, Node],
    newest: int | None,
    oldest: int | None = MARK,
    *,
    known: tuple[int, ...] = (),
    limit: int = 1024,
    clock: Any = None,
) -> discover.Search:
    extra = {"clock": clock} if clock is not None else {}
    return discover.Search(
        PID if fds is CTL_FILES else 1,
        fds,
        newest,
        rm.asker,
        oldest=oldest,
        known=known,
        refusals=discover.Refusals(limit),
        **extra,
    )


def run(search: discover.Search) -> discover.Search:
    while not search.done:
        search.step(10.0)
    return search


def test_a_search_finds_every_object_the_probe_saw_with_its_class_and_parent() -> None:
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    newest = 0xC1D00020  # the client this daemon allocates: newer than the tenant's
    search = run(searcher(rm, CTL_FILES, newest))
    assert search.error is None
    found = discover.process_state(PID, 55, CTL_FILES, search.found)
    expected = tree(proc)
    expected[0xC1D0001B][0xC1D0001B] = (abi.NV01_ROOT_CLIENT, None)
    # The second client's device has no TSG or channel below it: it and its client are all
    # the search asks about (no work to govern there).
    expected[0xC1D0001D] = {
        0xC1D0001D: (abi.NV01_ROOT_CLIENT, None),
        0xA55A0020: (0x80, 0xC1D0001D),
    }
    assert tree(found) == expected
    # What the rm enforcer uses of it is what it would use of the probe's view.
    tracker = Tracker()
    tracker.adopt(found)
    (group,) = tracker.channel_groups(PID)
    original = Tracker()
    original.adopt(proc)
    (reference,) = original.channel_groups(PID)
    assert (group.fd, group.client, group.subdevice, group.channels, group.tsgs) == (
        reference.fd,
        reference.client,
        reference.subdevice,
        reference.channels,
        reference.tsgs,
    )
    assert group.compute_tsgs == reference.compute_tsgs == (0x5C000015,)
    assert len(group.channels) == 20
    # Every descriptor the search took is given back, and only control descriptors were asked.
    assert rm.open == set()
    assert rm.asked == search.asked


def test_the_search_asks_its_range_newest_first_and_stops_at_the_client_with_channels() -> None:
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    refusals = discover.Refusals(1024)
    search = run(
        discover.Search(PID, CTL_FILES, 0xC1D00020, rm.asker, oldest=MARK, refusals=refusals)
    )
    # Client handles, from 0x20 down, each on descriptors 8, 15 and 17 in turn until one
    # answers: 0x1d answers on the third, 0x1b on the first, and holds the channels: the end.
    clients_asked = 5 * 3 + 1
    # The main client: its device asked for (GET_CHILD_HANDLE), a TSG below it, then every
    # handle from the device down to its lowest object (GAP_BELOW more) and from above it to
    # its highest (GAP more), and each object's parent.
    (main,) = [c for c in search.found if c.handle == 0xC1D0001B]
    handles = [h for h in main.objects if h != main.handle]
    device = 0x5C000002
    objects = 2 + (device - min(handles) + 1) + discover.GAP_BELOW
    objects += (max(handles) - device) + discover.GAP + len(handles)
    # The other: its device, no TSG and no channel below it, the device's class.
    other = 4
    assert search.asked == clients_asked + objects + other < 5_000
    # Refused: 0x20, 0x1f, 0x1e and 0x1c on all three, 0x1d on two. Nothing below 0x1b asked.
    assert refusals.spent == rm.refusals[0x23] == 14


def test_client_handles_run_newest_first_through_all_of_them_once() -> None:
    handles = discover.client_handles(0xC1D00002)
    assert list(itertools.islice(handles, 4)) == [0xC1D00002, 0xC1D00001, 0xC1D00000, 0xC1DFFFFF]
    every = list(discover.client_handles(None))
    assert len(every) == len(set(every)) == discover.CLIENT_HANDLE_COUNT == 0x100000
    assert min(every) == 0xC1D00000 and max(every) == 0xC1DFFFFF
    # A range: down to the mark, not including it, across the wrap.
    assert list(discover.client_handles(0xC1D00001, 0xC1DFFFFE)) == [
        0xC1D00001,
        0xC1D00000,
        0xC1DFFFFF,
    ]
    assert list(discover.client_handles(0xC1D00005, 0xC1D00005)) == []
    assert discover.client_before(0xC1D00000) == 0xC1DFFFFF
    assert discover.client_before(0xC1D00021) == 0xC1D00020


def test_objects_past_a_longer_run_of_freed_handles_than_gap_are_not_found() -> None:
    rm = RmDouble()
    client = 0xC1D00005
    objects = {
        0x5C000001: (0x80, client),
        0x5C000002: (0x2080, 0x5C000001),
        0x5C000003: (0xA06C, 0x5C000001),
        0x5C000004: (0xC86F, 0x5C000003),
        # A freed run of exactly GAP - 1 handles, then memory: found.
        0x5C000004 + discover.GAP: (0x40, 0x5C000001),
        # A run of GAP, then more: not found (memory allocated late; the channels are early).
        0x5C000004 + 2 * discover.GAP + 1: (0x40, 0x5C000001),
    }
    rm.add(1, 8, client, objects)
    search = run(searcher(rm, {8: Node.CTL}, 0xC1D00010, 0xC1D00000))
    (found,) = search.found
    assert set(found.objects) == {client, *list(objects)[:5]}
    assert found.channels == 1


def test_a_client_without_a_device_is_passed_over_and_the_search_goes_on() -> None:
    rm = RmDouble()
    rm.add(1, 8, 0xC1D00009, {})  # a client and nothing else (NVML's kind)
    rm.add(1, 8, 0xC1D00004, {0x10: (0x80, 0xC1D00004), 0x11: (0xA06C, 0x10), 0x12: (0xC86F, 0x11)})
    search = run(searcher(rm, {8: Node.CTL}, 0xC1D0000A, 0xC1D00000))
    assert [(c.handle, c.channels) for c in search.found] == [(0xC1D00004, 1)]


def test_a_process_with_no_channels_is_searched_through_its_range_and_no_further() -> None:
    rm = RmDouble()
    rm.add(1, 8, 0xC1D00009, {0x5C000020: (0x80, 0xC1D00009)})  # a device, no work below
    fds = {8: Node.CTL, 15: Node.CTL, 20: Node.GPU}
    search = run(searcher(rm, fds, 0xC1D00200, 0xC1D00000))
    assert [(c.handle, c.channels) for c in search.found] == [(0xC1D00009, 0)]
    # Each handle of the range on both control descriptors (not the GPU's), but the client's own
    # only on the descriptor it answered on; then its device, no TSG or channel below it, its
    # class. Nothing at or below the mark.
    assert search.asked == 0x200 * 2 - 1 + 4
    assert rm.refusals[0x23] == 0x1FF * 2


def test_a_search_stops_at_its_budget_of_refusals() -> None:
    """Each refusal may be a client that does not exist, and a line in the kernel log."""
    rm = RmDouble()
    search = run(searcher(rm, {8: Node.CTL, 15: Node.CTL}, 0xC1D00200, 0xC1D00000, limit=100))
    assert search.error is not None and "stopped after 100 client handles" in search.error
    assert rm.refusals[0x23] == 101 and search.found == [] and rm.open == set()


def test_with_client_checks_only_clients_that_exist_are_asked_and_nothing_is_logged() -> None:
    """Call 24B (an H200): 300 clients made and freed after two trainers, asked on each of
    their three control descriptors, spent the daemon's 1 024 refusals (1 026 kernel log lines)
    before either trainer's client. Checked first by making a client at each handle, a freed
    one is not asked at all; one another file holds is asked, refused, and logs nothing."""
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    rm.add(999, 3, 0xC1D00100, {})  # a live client of another process (NVML), among them
    refusals = discover.Refusals(10)
    search = run(
        discover.Search(
            PID, CTL_FILES, 0xC1D00200, rm.asker, oldest=MARK, refusals=refusals,
            in_use=rm.in_use,
        )
    )  # fmt: skip
    assert search.error is None
    assert {c.handle for c in search.found} == {0xC1D0001B, 0xC1D0001D}
    assert rm.logged == 0 and refusals.spent == 0
    # Checked: 0x200 down to 0x1b. Asked: the other process's client on all three descriptors,
    # 0x1d on the first two (refused) and the third, 0x1b on the first.
    assert rm.checked == 0x200 - 0x1B + 1
    assert rm.refusals[0x23] == 3 + 2
    # Without the checks the same range spends the budget and writes a line per question.
    again = RmDouble()
    again.add_process(proc)
    search = run(searcher(again, CTL_FILES, 0xC1D00200, limit=10))
    assert search.error is not None and again.logged == 11 and search.found == []


def test_a_check_that_cannot_tell_falls_back_to_asking_with_the_budget() -> None:
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    refusals = discover.Refusals(1024)
    search = run(
        discover.Search(
            PID, CTL_FILES, 0xC1D00020, rm.asker, oldest=MARK, refusals=refusals,
            in_use=lambda handle: None,
        )
    )  # fmt: skip
    assert {c.handle for c in search.found} == {0xC1D0001B, 0xC1D0001D}
    assert refusals.spent == rm.refusals[0x23] == 14  # as without checks


def test_known_client_handles_are_asked_first_and_no_range_without_both_ends() -> None:
    """Handles the tracker knows (objects were seen made under them) exist: asking them refuses
    nothing on their own file. Without a mark, or a newest, no range is asked at all."""
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    for newest, oldest in ((0xC1D00020, None), (None, MARK)):
        refusals = discover.Refusals(1024)
        search = run(
            discover.Search(
                PID,
                CTL_FILES,
                newest,
                rm.asker,
                oldest=oldest,
                known=(0xC1D0001B,),
                refusals=refusals,
            )
        )
        assert [c.handle for c in search.found] == [0xC1D0001B]
        assert refusals.spent == 0  # 0x1b answers on fd 8, the first asked
    nothing = run(searcher(rm, CTL_FILES, None, None))
    assert nothing.found == [] and nothing.asked == 0


def test_a_search_runs_in_slices_of_the_time_it_is_given() -> None:
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    now = [0.0]

    def clock() -> float:
        now[0] += 1e-6  # each look at the clock a microsecond later
        return now[0]

    search = searcher(rm, CTL_FILES, 0xC1D00020, clock=clock)
    slices = 0
    found: list[discover.FoundClient] = []
    while not search.done:
        before = search.asked
        found += search.step(0.0)
        slices += 1
        # A slice given no time still makes progress, and stops at its first look.
        assert 0 < search.asked - before <= discover.CHECK_EVERY or search.done
    assert slices > 50
    assert [c.handle for c in found] == [c.handle for c in search.found]
    whole = RmDouble()
    whole.add_process(proc)
    at_once = run(searcher(whole, CTL_FILES, 0xC1D00020))
    assert [c.objects for c in at_once.found] == [c.objects for c in found]
    assert at_once.asked == search.asked
    assert rm.open == set()


def test_a_descriptor_that_goes_away_ends_the_search_and_gives_back_the_others() -> None:
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    rm.fail_after = 5
    search = run(searcher(rm, CTL_FILES, 0xC1D00020))
    assert search.error is not None and "Bad file descriptor" in search.error
    assert search.found == []
    assert rm.open == set()


def test_closing_a_search_midway_gives_back_its_descriptors() -> None:
    proc = traced()
    rm = RmDouble()
    rm.add_process(proc)
    search = searcher(rm, CTL_FILES, 0xC1D00020, clock=lambda: 1.0)
    search.step(0.0)
    assert rm.open == {(PID, 8), (PID, 15), (PID, 17)}
    search.close()
    assert search.done and rm.open == set()
    assert search.step(1.0) == []


# -- the real request, against a stand-in for the ioctl ------------------------------------------


class FakeLibc:
    """Decodes the RM_CONTROL requests HandleAsker sends and answers as RM would."""

    def __init__(self, answers: dict[tuple[int, int, int], int]) -> None:
        self.answers = answers  # (client, cmd, handle or parent) -> data
        self.seen: list[dict[str, Any]] = []

    def ioctl(self, fd: int, request: int, buffer: Any) -> int:
        assert request == rmctl.RM_CONTROL_REQUEST
        raw = bytes(buffer)
        control = abi.NVOS54.unpack(raw)
        params = ctypes.string_at(control["params"], control["paramsSize"])
        self.seen.append(control)
        status = 0x57
        if control["cmd"] == abi.NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO:
            asked = abi.NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS.unpack(params)
            key = (control["hClient"], asked["index"], asked["hObject"])
            if key in self.answers:
                status = 0
                out = struct.pack("<IIQ", asked["hObject"], asked["index"], self.answers[key])
                ctypes.memmove(control["params"], out, len(out))
        else:
            asked = abi.NV0000_CTRL_CMD_CLIENT_GET_CHILD_HANDLE_PARAMS.unpack(params)
            key = (control["hClient"], asked["classId"], asked["hParent"])
            if key in self.answers:
                status = 0
                out = struct.pack("<III", asked["hParent"], asked["classId"], self.answers[key])
                ctypes.memmove(control["params"], out, len(out))
        ctypes.memmove(ctypes.addressof(buffer) + 28, struct.pack("<I", status), 4)  # NVOS54.status
        return 0


def test_the_handle_asker_sends_each_control_to_the_client_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeLibc(
        {
            (0xC1D00001, abi.HANDLE_INFO_INDEX_CLASSID, 0x5C000003): 0x2080,
            (0xC1D00001, abi.HANDLE_INFO_INDEX_PARENT, 0x5C000003): 0x5C000002,
            (0xC1D00001, abi.NVOC_CLASS_ID_DEVICE, 0xC1D00001): 0x5C000002,
        }
    )
    monkeypatch.setattr(rmctl, "_libc", fake)
    ask = rmctl.HandleAsker(7)
    assert ask.info(0xC1D00001, 0x5C000003, abi.HANDLE_INFO_INDEX_CLASSID) == 0x2080
    assert ask.info(0xC1D00001, 0x5C000003, abi.HANDLE_INFO_INDEX_PARENT) == 0x5C000002
    assert ask.info(0xC1D00002, 0x5C000003, abi.HANDLE_INFO_INDEX_CLASSID) is None
    assert ask.status == 0x57
    assert ask.child(0xC1D00001, 0xC1D00001, abi.NVOC_CLASS_ID_DEVICE) == 0x5C000002
    assert ask.child(0xC1D00001, 0xC1D00001, 0x80) is None
    assert ask.asked == 5
    for control in fake.seen:
        assert control["hObject"] == control["hClient"]
    assert [c["cmd"] for c in fake.seen] == [0xD02, 0xD02, 0xD02, 0xD05, 0xD05]
    assert [c["paramsSize"] for c in fake.seen] == [16, 16, 16, 12, 12]


# -- what the tracker makes of it -----------------------------------------------------------------


def test_found_clients_join_what_the_probe_saw_since() -> None:
    """A process the probe saw only allocate memory under a client it never saw allocated (a
    stand-in client, no file): the search's client takes its place and keeps that memory."""
    tracker = Tracker()
    known = ProcessState(PID)
    tracker.adopt(known)
    tracker._alloc(known, 8, 0xC1D00001, 0x10, 0x99, 0x40, 1 << 20)  # probe: memory, after
    assert known.clients[0xC1D00001].fd is None
    found = discover.FoundClient(
        8,
        0xC1D00001,
        {
            0xC1D00001: (abi.NV01_ROOT_CLIENT, None),
            0x10: (0x80, 0xC1D00001),
            0x11: (0xA06C, 0x10),
            0x12: (0xC86F, 0x11),
        },
    )
    tracker.add_clients(discover.process_state(PID, 55, {8: Node.CTL}, [found]))
    proc = tracker.processes[PID]
    assert proc.cgroup == 55 and proc.fds == {8: Node.CTL}
    client = proc.clients[0xC1D00001]
    assert client.fd == 8
    assert set(client.objects) == {0xC1D00001, 0x10, 0x11, 0x12, 0x99}
    assert client.objects[0x10].children == {0x11, 0x99}
    assert proc.device_bytes == 1 << 20
    (group,) = tracker.channel_groups(PID)
    assert group.fd == 8 and group.channels == (0x12,)
    # A client the tracker knows on a file is left as it is.
    other = dataclasses.replace(found, objects={0xC1D00001: (abi.NV01_ROOT_CLIENT, None)})
    tracker.add_clients(discover.process_state(PID, 55, {8: Node.CTL}, [other]))
    assert set(tracker.processes[PID].clients[0xC1D00001].objects) == set(client.objects)
    assert tracker.processes[PID].objects(Kind.CHANNEL)[0].handle == 0x12


class FakeClients:
    """Decodes the RM_ALLOC and RM_FREE requests ClientCheck sends; RM's table of clients."""

    def __init__(self, clients: set[int], status: int | None = None) -> None:
        self.clients = clients
        self.status = status  # forced answer to an alloc
        self.rename = 0  # RM numbers the client this much past the one asked
        self.seen: list[tuple[str, dict[str, int]]] = []

    def ioctl(self, fd: int, request: int, buffer: Any) -> int:
        raw = bytes(buffer)
        if request == rmctl.RM_ALLOC_REQUEST:
            alloc = abi.NVOS21.unpack(raw)
            self.seen.append(("alloc", alloc))
            handle = alloc["hRoot"] + self.rename
            if self.status is not None:
                status = self.status
            elif alloc["hRoot"] in self.clients:
                status = abi.NvStatus.NV_ERR_INSERT_DUPLICATE_NAME
            else:
                status = 0
                self.clients.add(handle)
                struct.pack_into("<I", buffer, 8, handle)
            struct.pack_into("<I", buffer, 28, status)
            return 0
        assert request == rmctl.RM_FREE_REQUEST
        free = abi.NVOS00.unpack(raw)
        self.seen.append(("free", free))
        assert free["hRoot"] == free["hObjectOld"]
        self.clients.discard(free["hRoot"])
        struct.pack_into("<I", buffer, 12, 0)
        return 0


def test_the_client_check_makes_a_client_at_the_handle_and_frees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeClients({0xC1D00005})
    monkeypatch.setattr(rmctl, "_libc", fake)
    check = rmctl.ClientCheck("/dev/null")
    try:
        assert check.in_use(0xC1D00005) is True
        ((kind, alloc),) = fake.seen
        assert kind == "alloc" and alloc["hClass"] == abi.NV01_ROOT_CLIENT
        assert (alloc["hRoot"], alloc["hObjectNew"]) == (0xC1D00005, 0xC1D00005)
        assert (alloc["pAllocParms"], alloc["paramsSize"]) == (0, 0)
        fake.seen.clear()
        assert check.in_use(0xC1D00004) is False
        assert [kind for kind, _ in fake.seen] == ["alloc", "free"]
        assert fake.seen[1][1]["hObjectOld"] == 0xC1D00004
        assert fake.clients == {0xC1D00005}  # nothing left made
        # RM named another handle (it did not take the one asked): freed, and no answer.
        fake.rename = 1
        assert check.in_use(0xC1D00007) is None and fake.clients == {0xC1D00005}
        fake.rename = 0
        # Any other status: no answer either way.
        fake.status = 0x1A
        assert check.in_use(0xC1D00009) is None
        assert check.checked == 4
    finally:
        check.close()


def test_a_client_allocated_for_rm_to_number_gives_its_handle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = iter([(0, 0, 0xC1D00042), (0, 0x1A, 0), (-1, 0, 0)])

    class Libc:
        def ioctl(self, fd: int, request: int, buffer: Any) -> int:
            assert request == rmctl.RM_ALLOC_REQUEST
            alloc = abi.NVOS21.unpack(bytes(buffer))
            assert (alloc["hRoot"], alloc["hClass"]) == (0, abi.NV01_ROOT_CLIENT)
            ret, status, handle = next(answers)
            struct.pack_into("<I", buffer, 8, handle)
            struct.pack_into("<I", buffer, 28, status)
            return ret

    monkeypatch.setattr(rmctl, "_libc", Libc())
    assert rmctl.newest_client_handle("/dev/null") == 0xC1D00042
    assert rmctl.newest_client_handle("/dev/null") is None  # RM refused
    assert rmctl.newest_client_handle("/dev/null") is None  # the ioctl failed
    assert rmctl.newest_client_handle("/nonexistent/nvidiactl") is None
