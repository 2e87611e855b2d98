"""The live view without a kernel: synthetic probe records that succeed (the host tier can only
produce failed RM calls), counters per cgroup, the cgroup filter and the interval loop."""

import signal
import threading
from pathlib import Path

import pytest

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Node
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.devices import DeviceFilter
from qpolicy.telemetry.live import LiveView, Snapshot, run, stop_on
from qpolicy.telemetry.probe import CgroupCounters
from qpolicy.telemetry.wire import ProbeRecord

GiB = 1 << 30
RM_ALLOC = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC, 48)
RM_FREE = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_FREE, 16)


class FakeProbe:
    def __init__(self) -> None:
        self.pending: list[ProbeRecord] = []
        self.counts: dict[int, CgroupCounters] = {}
        self.devices = DeviceFilter.nvidia("")
        self.lost = 0
        self.polls: list[int] = []

    def poll(self, timeout_ms: int = 0) -> list[ProbeRecord]:
        self.polls.append(timeout_ms)
        out, self.pending = self.pending, []
        return out

    def counters(self) -> dict[int, CgroupCounters]:
        return dict(self.counts)

    def node_of(self, major: int, minor: int) -> Node:
        return self.devices.node_of(major, minor)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rm_alloc(
    pid: int,
    cgroup: int,
    handle: int,
    parent: int,
    cls: int,
    inner: bytes = b"",
    *,
    ret: int = 0,
    status: int = 0,
) -> ProbeRecord:
    client = 0xC1D00001
    arg = abi.NVOS64.pack(
        hRoot=client if cls != 0x41 else handle,
        hObjectParent=parent,
        hObjectNew=handle,
        hClass=cls,
        pAllocParms=0x1000 if inner else 0,
        status=status,
    )
    return ProbeRecord(
        "ioctl",
        ts=1,
        tid=pid,
        cmd=RM_ALLOC,
        a1=5,
        a2=0x10,
        a3=0x1000 if inner else 0,
        ret=ret,
        p=arg,
        q=inner,
        pid=pid,
        cgroup=cgroup,
        major=195,
        minor=0,
    )


def process(
    pid: int, cgroup: int, tsgs: int, channels_per_tsg: int, vidmem: int
) -> list[ProbeRecord]:
    client = 0xC1D00001
    records = [
        ProbeRecord(
            "open",
            ts=0,
            tid=pid,
            ret=5,
            s="/dev/nvidia0",
            pid=pid,
            cgroup=cgroup,
            major=195,
            minor=0,
        ),
        rm_alloc(pid, cgroup, client, 0, 0x41),
        rm_alloc(pid, cgroup, 0xD0, client, 0x80, abi.NV0080_ALLOC_PARAMETERS.pack(deviceId=0)),
    ]
    for t in range(tsgs):
        tsg = 0x100 + t
        records.append(rm_alloc(pid, cgroup, tsg, 0xD0, 0xA06C))
        for c in range(channels_per_tsg):
            records.append(rm_alloc(pid, cgroup, 0x200 + t * 16 + c, tsg, 0xC86F))
    if vidmem:
        params = abi.NV_MEMORY_ALLOCATION_PARAMS.pack(size=vidmem)
        records.append(rm_alloc(pid, cgroup, 0x300, 0xD0, 0x40, params))
    return records  # fmt: skip


Cgroups = tuple[CgroupMap, int, int, int]


@pytest.fixture
def cgroups(tmp_path: Path) -> Cgroups:
    for rel in ("kubepods/pod-a", "kubepods/pod-a/ctr", "system/other"):
        (tmp_path / rel).mkdir(parents=True)
    cmap = CgroupMap(tmp_path)
    return (
        cmap,
        cmap.id_of("/kubepods/pod-a"),
        cmap.id_of("/kubepods/pod-a/ctr"),
        cmap.id_of("/system/other"),
    )


def test_rows_aggregate_the_tracker_and_the_counters_per_cgroup(cgroups: Cgroups) -> None:
    cmap, pod, ctr, other = cgroups
    fake, clock = FakeProbe(), Clock()
    view = LiveView(fake, cmap, clock=clock)
    fed = [
        *process(10, pod, tsgs=2, channels_per_tsg=3, vidmem=GiB),
        *process(11, ctr, tsgs=1, channels_per_tsg=1, vidmem=0),
        *process(12, ctr, tsgs=1, channels_per_tsg=2, vidmem=2 * GiB),
    ]
    view.feed(fed)
    # A failed allocation creates nothing; a free removes the TSG and its channels.
    view.feed([rm_alloc(10, pod, 0x999, 0xD0, 0xA06C, ret=-22)])
    view.feed([rm_alloc(10, pod, 0x998, 0xD0, 0xA06C, status=abi.NvStatus.NV_ERR_NO_MEMORY)])
    free = abi.NVOS00.pack(hRoot=0xC1D00001, hObjectParent=0xD0, hObjectOld=0x100)
    view.feed([ProbeRecord("ioctl", ts=2, tid=10, cmd=RM_FREE, a1=5, p=free, pid=10, cgroup=pod,
                           major=195, minor=0)])  # fmt: skip
    fake.counts = {
        pod: CgroupCounters(pod, ioctls=100, launches=10, escapes={"RM_ALLOC": 100}),
        ctr: CgroupCounters(ctr, ioctls=50, launches=0),
        other: CgroupCounters(other, ioctls=7, launches=1000),
    }
    clock.now += 2
    snap = view.snapshot()
    rows = {row.cgroup: row for row in snap.rows}
    assert set(rows) == {"/kubepods/pod-a", "/kubepods/pod-a/ctr", "/system/other"}
    a = rows["/kubepods/pod-a"]
    assert (a.processes, a.tsgs, a.channels, a.device_bytes) == (1, 1, 3, GiB)
    assert (a.ioctls, a.ioctls_per_s, a.launches_per_s) == (100, 50.0, 5.0)
    assert a.escapes == {"RM_ALLOC": 100}
    b = rows["/kubepods/pod-a/ctr"]
    assert (b.processes, b.tsgs, b.channels, b.device_bytes) == (2, 2, 3, 2 * GiB)
    assert snap.interval_s == 2 and snap.records == len(fed) + 3

    # Rates are per interval; an exit drops what the process held.
    fake.counts[pod] = CgroupCounters(pod, ioctls=130, launches=10)
    view.feed([ProbeRecord("exit", ts=3, tid=12, pid=12, cgroup=ctr)])
    clock.now += 1
    rows = {row.cgroup: row for row in view.snapshot().rows}
    assert rows["/kubepods/pod-a"].ioctls_per_s == 30.0
    assert rows["/kubepods/pod-a"].launches_per_s == 0.0
    assert (rows["/kubepods/pod-a/ctr"].processes, rows["/kubepods/pod-a/ctr"].channels) == (1, 1)


def test_the_cgroup_filter_keeps_descendants(cgroups: Cgroups) -> None:
    cmap, pod, ctr, other = cgroups
    fake = FakeProbe()
    fake.counts = {cgid: CgroupCounters(cgid, ioctls=1) for cgid in (pod, ctr, other, 987654321)}
    view = LiveView(fake, cmap, "/kubepods/pod-a")
    assert [row.cgroup for row in view.snapshot().rows] == [
        "/kubepods/pod-a",
        "/kubepods/pod-a/ctr",
    ]
    unfiltered = LiveView(fake, cmap)
    assert "cgroup#987654321" in [row.cgroup for row in unfiltered.snapshot().rows]


def test_snapshot_json(cgroups: Cgroups) -> None:
    cmap, pod, _, _ = cgroups
    fake = FakeProbe()
    fake.counts = {pod: CgroupCounters(pod, ioctls=3, controls={"X": 1}, allocs={"Y": 2})}
    data = LiveView(fake, cmap).snapshot().to_json()
    assert set(data) == {"ts", "interval_s", "records", "lost_events", "cgroups"}
    (row,) = data["cgroups"]
    assert row["cgroup"] == "/kubepods/pod-a" and row["id"] == pod
    assert row["controls"] == {"X": 1} and row["allocs"] == {"Y": 2}


class SteppingProbe(FakeProbe):
    """Each poll advances the fake clock by the time it was allowed to wait."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def poll(self, timeout_ms: int = 0) -> list[ProbeRecord]:
        self.clock.now += max(timeout_ms, 1) / 1000
        return super().poll(timeout_ms)


def test_run_emits_every_interval_until_the_duration(tmp_path: Path) -> None:
    clock = Clock()
    fake = SteppingProbe(clock)
    view = LiveView(fake, CgroupMap(tmp_path), clock=clock)
    snaps: list[Snapshot] = []
    run(view, 1.0, 3.5, snaps.append, clock=clock)
    assert len(snaps) == 4  # at 1, 2, 3 and the last half interval at 3.5
    assert [round(s.interval_s, 1) for s in snaps] == [1.0, 1.0, 1.0, 0.5]
    assert max(fake.polls) <= 200  # Ctrl-C is noticed within a fifth of a second


def test_ctrl_c_emits_a_last_snapshot(tmp_path: Path) -> None:
    clock = Clock()

    class Interrupting(SteppingProbe):
        def poll(self, timeout_ms: int = 0) -> list[ProbeRecord]:
            if clock.now > 1001.5 and timeout_ms:
                raise KeyboardInterrupt
            return super().poll(timeout_ms)

    view = LiveView(Interrupting(clock), CgroupMap(tmp_path), clock=clock)
    snaps: list[Snapshot] = []
    run(view, 1.0, None, snaps.append, clock=clock)
    assert len(snaps) == 2
    assert snaps[-1].interval_s < 1.0


def test_a_stop_request_emits_a_last_snapshot(tmp_path: Path) -> None:
    clock = Clock()
    fake = SteppingProbe(clock)
    view = LiveView(fake, CgroupMap(tmp_path), clock=clock)
    snaps: list[Snapshot] = []
    run(view, 1.0, None, snaps.append, clock=clock, stop=lambda: clock.now > 1001.5)
    assert len(snaps) == 2
    assert snaps[-1].interval_s < 1.0
    assert max(fake.polls) <= 200


def test_sigint_under_stop_on_only_asks_and_is_ignored_after() -> None:
    """No KeyboardInterrupt (it would be dropped inside bcc's poll callback), and once the
    trace has stopped because of it, a second Ctrl-C cannot abort the exit."""
    before = signal.getsignal(signal.SIGINT)
    try:
        with stop_on(signal.SIGINT) as stop:
            assert not stop()
            signal.raise_signal(signal.SIGINT)  # Python's handlers run before it returns
            assert stop() and stop.signum == signal.SIGINT
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)


def test_stop_on_puts_the_handler_back_when_no_signal_came() -> None:
    before = signal.getsignal(signal.SIGINT)
    with stop_on(signal.SIGINT) as stop:
        assert signal.getsignal(signal.SIGINT) != before
    assert not stop()
    assert signal.getsignal(signal.SIGINT) == before


def test_stop_on_outside_the_main_thread_installs_nothing() -> None:
    before = signal.getsignal(signal.SIGINT)
    seen: list[object] = []

    def body() -> None:
        with stop_on(signal.SIGINT) as stop:
            seen.append(signal.getsignal(signal.SIGINT))
        seen.append(stop())

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before, False]
