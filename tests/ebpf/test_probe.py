"""The probe on the running kernel: exact per-cgroup counts, streamed outcomes, exits, uprobes."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import Escape, Node
from qpolicy.nvrm.decode import decode
from qpolicy.nvrm.tracker import Tracker
from qpolicy.telemetry.devices import DeviceFilter
from qpolicy.telemetry.probe import MAX_POLL_RECORDS, CgroupCounters, NvProbe
from qpolicy.telemetry.wire import P_BYTES, Q_BYTES

from .conftest import TEST_DEVICES, Cgroup, Collected, Workload, collect

Spawn = Callable[[Cgroup, list[dict[str, Any]]], Workload]
MakeCgroup = Callable[[], Cgroup]

CLIENT = 0xC1D00001
RM_ALLOC_48 = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC, 48)
RM_ALLOC_32 = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC, 32)
RM_CONTROL = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_CONTROL, 32)
RM_FREE = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_FREE, 16)
RM_ALLOC_MEMORY = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC_MEMORY, 56)
CARD_INFO = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.CARD_INFO, 72)
UNKNOWN_ESCAPE = abi.iowr(abi.NV_IOCTL_MAGIC, 0x99, 8)
TCGETS = 0x5401
UVM_REGISTER_CHANNEL = 27
UVM_INITIALIZE = 0x30000001
TSG_PARAMS = bytes(range(1, 97))  # 96 recognisable bytes


def alloc48(handle: int, cls: int) -> str:
    return abi.NVOS64.pack(hRoot=CLIENT, hObjectParent=CLIENT, hObjectNew=handle, hClass=cls).hex()


def alloc32(handle: int, cls: int) -> str:
    return abi.NVOS21.pack(hRoot=CLIENT, hObjectParent=CLIENT, hObjectNew=handle, hClass=cls).hex()


def control(cmd: int) -> str:
    return abi.NVOS54.pack(hClient=CLIENT, hObject=0xCAF0, cmd=cmd).hex()


def free(handle: int) -> str:
    return abi.NVOS00.pack(hRoot=CLIENT, hObjectParent=CLIENT, hObjectOld=handle).hex()


def alloc_memory(handle: int, cls: int) -> str:
    return abi.NVOS02_WITH_FD.pack(
        hRoot=CLIENT, hObjectParent=CLIENT, hObjectNew=handle, hClass=cls, limit=4095
    ).hex()


def sequence(scale: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A known mix of escapes, controls and classes; ``scale`` makes two cgroups' mixes differ.

    Returns the workload steps and the counts the probe must report for them.
    """
    n = scale
    steps: list[dict[str, Any]] = [
        {"open": "/dev/full", "as": "ctl"},
        {"open": "/dev/zero", "as": "uvm"},
        {"ioctl": "ctl", "cmd": RM_ALLOC_48, "arg": alloc48(0xA0, 0xA06C), "times": 3 * n},
        {"ioctl": "ctl", "cmd": RM_ALLOC_32, "arg": alloc32(0xB0, 0xC86F), "times": 2 * n},
        {
            "ioctl": "ctl",
            "cmd": RM_CONTROL,
            "arg": control(abi.NVA06C_CTRL_CMD_SET_TIMESLICE),
            "times": 4 * n,
        },
        {
            "ioctl": "ctl",
            "cmd": RM_CONTROL,
            "arg": control(abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE),
            "times": n,
        },
        {
            "ioctl": "ctl",
            "cmd": RM_CONTROL,
            "arg": control(abi.NV2080_CTRL_CMD_FIFO_GET_INFO),
            "times": 5 * n,
        },
        {"ioctl": "ctl", "cmd": RM_FREE, "arg": free(0xA0), "times": 2 * n},
        {
            "ioctl": "ctl",
            "cmd": RM_ALLOC_MEMORY,
            "arg": alloc_memory(0xD0, 0x3E),
            "times": n,
        },
        {"ioctl": "ctl", "cmd": CARD_INFO, "arg": "00" * 72, "times": n},
        {"ioctl": "ctl", "cmd": UNKNOWN_ESCAPE, "arg": "00" * 8, "times": n},
        {"ioctl": "ctl", "cmd": TCGETS, "arg": "00" * 64, "times": n},
        {"ioctl": "uvm", "cmd": UVM_INITIALIZE, "times": n},
        {"ioctl": "uvm", "cmd": UVM_REGISTER_CHANNEL, "times": 2 * n},
        {"mmap": "uvm"},
        {"mmap": "ctl"},
        {"close": "ctl"},
        {"close": "uvm"},
    ]
    expected = {
        "escapes": {
            "RM_ALLOC": 5 * n,
            "RM_CONTROL": 10 * n,
            "RM_FREE": 2 * n,
            "RM_ALLOC_MEMORY": n,
            "CARD_INFO": n,
            "escape 0x99": n,
            "ioctl 0x5401": n,
            "UVM_INITIALIZE": n,
            "UVM_REGISTER_CHANNEL": 2 * n,
        },
        "controls": {
            "NVA06C_CTRL_CMD_SET_TIMESLICE": 4 * n,
            "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE": n,
            "ctrl 0x20801109": 5 * n,
        },
        "allocs": {
            "KEPLER_CHANNEL_GROUP_A": 3 * n,
            "HOPPER_CHANNEL_GPFIFO_A": 2 * n,
            "NV01_MEMORY_SYSTEM": n,
        },
        "opens": 2,
        "mmaps": 2,
    }
    expected["ioctls"] = sum(expected["escapes"].values())
    return steps, expected


def assert_counts(probe: NvProbe, cgroup: Cgroup, expected: dict[str, Any]) -> None:
    counts = probe.counters()[cgroup.id]
    assert dict(counts.escapes) == expected["escapes"]
    assert dict(counts.controls) == expected["controls"]
    assert dict(counts.allocs) == expected["allocs"]
    assert counts.ioctls == expected["ioctls"]
    assert counts.opens == expected["opens"]
    assert counts.mmaps == expected["mmaps"]
    assert sum(counts.latency_log2) == counts.ioctls
    assert counts.latency_sum_ns > 0


def test_counts_are_exact_per_cgroup_with_two_processes(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    a, b = make_cgroup(), make_cgroup()
    steps_a, expected_a = sequence(1)
    steps_b, expected_b = sequence(3)
    first, second = spawn(a, steps_a), spawn(b, steps_b)
    first.go()
    second.go()
    report_a, report_b = first.report(), second.report()
    # Every RM request fails on /dev/full and /dev/zero: the ioctls reached the driver.
    assert report_a["errors"] == {"ENOTTY": expected_a["ioctls"]}
    assert report_b["errors"] == {"ENOTTY": expected_b["ioctls"]}
    assert_counts(probe, a, expected_a)
    assert_counts(probe, b, expected_b)

    # Dropping a cgroup's counters removes every key it had and leaves the others alone.
    before = probe.counters()[a.id]
    keys = 1 + len(before.escapes) + len(before.controls) + len(before.allocs)
    keys += sum(1 for count in before.latency_log2 if count)
    assert probe.forget([a.id]) == keys
    assert a.id not in probe.counters()
    assert_counts(probe, b, expected_b)


def test_rm_alloc_outcomes_carry_what_the_process_sent(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    cgroup = make_cgroup()
    steps: list[dict[str, Any]] = [
        {"open": "/dev/full", "as": "ctl"},
        {
            "ioctl": "ctl",
            "cmd": RM_ALLOC_48,
            "arg": alloc48(0xA1, 0xA06C),
            "inner": TSG_PARAMS.hex(),
        },
        {
            "ioctl": "ctl",
            "cmd": RM_ALLOC_32,
            "arg": alloc32(0xB1, 0xC86F),
            "inner": TSG_PARAMS.hex(),
        },
        # Params that end where an unmapped page begins: the probe reads what the page holds.
        {
            "ioctl": "ctl",
            "cmd": RM_CONTROL,
            "arg": control(abi.NVA06C_CTRL_CMD_SET_TIMESLICE),
            "inner": (2048).to_bytes(8, "little").hex(),
            "inner_page_end": True,
        },
        {"ioctl": "ctl", "cmd": RM_CONTROL, "arg": control(abi.NV2080_CTRL_CMD_FIFO_GET_INFO)},
        {"ioctl": "ctl", "cmd": RM_FREE, "arg": free(0xA1)},
        {"ioctl": "ctl", "cmd": RM_ALLOC_MEMORY, "arg": alloc_memory(0xD1, 0x40)},
        {"close": "ctl"},
    ]
    workload = spawn(cgroup, steps)
    workload.go()
    workload.report()
    got = collect(probe, lambda c: len(c.of(cgroup, "exit")) == 1)
    ioctls = got.of(cgroup, "ioctl")
    # FIFO_GET_INFO is counted but not streamed: the tracker does not use it.
    assert [r.cmd for r in ioctls] == [
        RM_ALLOC_48,
        RM_ALLOC_32,
        RM_CONTROL,
        RM_FREE,
        RM_ALLOC_MEMORY,
    ]
    opened = got.of(cgroup, "open")[0]
    fd = opened.ret
    for record in ioctls:
        assert record.pid == workload.pid
        assert record.a1 == fd
        assert record.ret == -errno.ENOTTY
        assert (record.major, record.minor) == (1, 7)
        assert probe.node_of(record.major, record.minor) is Node.CTL
        assert record.dur_ns > 0
    alloc48_rec, alloc32_rec, timeslice, free_rec, memory = ioctls
    first = decode(Node.CTL, alloc48_rec.cmd, alloc48_rec.p, alloc48_rec.q)
    assert len(alloc48_rec.p) == 48
    assert (first.fields["hRoot"], first.fields["hObjectNew"]) == (CLIENT, 0xA1)
    assert first.alloc_class == 0xA06C
    assert first.fields["pAllocParms"] == alloc48_rec.a3 != 0
    assert alloc48_rec.q == TSG_PARAMS[:Q_BYTES]
    second = decode(Node.CTL, alloc32_rec.cmd, alloc32_rec.p, alloc32_rec.q)
    assert len(alloc32_rec.p) == 32
    assert (second.fields["hObjectNew"], second.alloc_class) == (0xB1, 0xC86F)
    assert alloc32_rec.q == TSG_PARAMS
    slice_ = decode(Node.CTL, timeslice.cmd, timeslice.p, timeslice.q)
    assert slice_.control == abi.NVA06C_CTRL_CMD_SET_TIMESLICE
    assert timeslice.q == (2048).to_bytes(8, "little")  # only the bytes before the guard page
    assert slice_.params == {"timesliceUs": 2048}
    assert decode(Node.CTL, free_rec.cmd, free_rec.p).fields["hObjectOld"] == 0xA1
    assert memory.a3 == 0 and memory.q == b""
    assert decode(Node.CTL, memory.cmd, memory.p).alloc_class == 0x40
    assert all(len(r.p) <= P_BYTES for r in ioctls)

    # The driver said no, so the tracker holds nothing for this process.
    tracker = Tracker()
    for record in got.of(cgroup):
        if record.kind != "exit":
            tracker.feed(record, node=probe.node_of(record.major, record.minor))
    summary = tracker.summary(workload.pid)
    assert (summary.clients, summary.tsgs, summary.channel_count) == (0, 0, 0)
    assert summary.failed == 5


def test_open_and_close_records(probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn) -> None:
    cgroup = make_cgroup()
    vias = ["openat", "open", "openat2"]
    steps: list[dict[str, Any]] = []
    for via in vias:
        steps += [{"open": "/dev/full", "as": via, "via": via}, {"close": via}]
    steps += [{"open": "/dev/null", "as": "unwatched"}, {"close": "unwatched"}]
    workload = spawn(cgroup, steps)
    workload.go()
    workload.report()
    got = collect(probe, lambda c: len(c.of(cgroup, "exit")) == 1)
    opens, closes = got.of(cgroup, "open"), got.of(cgroup, "close")
    # openat is always traced; open and openat2 where this kernel has their tracepoints.
    assert len(opens) == 1 + bool(probe.features["open"]) + bool(probe.features["openat2"])
    assert len(closes) == len(vias)  # /dev/null is not watched
    for record in opens:
        assert record.s == "/dev/full"
        assert record.pid == workload.pid
        assert record.a1 & os.O_ACCMODE == os.O_RDWR
        assert record.a1 & os.O_CLOEXEC
        assert record.ret >= 0
    assert {c.a1 for c in closes} >= {o.ret for o in opens}
    assert probe.counters()[cgroup.id].opens == len(opens)

    # Once the cgroup is gone its counters can be dropped.
    assert probe.forget([cgroup.id]) == 1  # opens only: its stats entry
    assert cgroup.id not in probe.counters()


def test_sigkill_mid_loop_leaves_the_probe_and_other_cgroups_exact(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    doomed_cgroup, steady_cgroup = make_cgroup(), make_cgroup()
    doomed = spawn(
        doomed_cgroup,
        [
            {"open": "/dev/full", "as": "ctl"},
            {"say": "looping"},
            {
                "forever": [
                    {
                        "ioctl": "ctl",
                        "cmd": RM_CONTROL,
                        "arg": control(abi.NV2080_CTRL_CMD_FIFO_GET_INFO),
                        "times": 100,
                    },
                    {"ioctl": "ctl", "cmd": RM_ALLOC_48, "arg": alloc48(0xA2, 0xA06C)},
                ]
            },
        ],
    )
    steps, expected = sequence(50)
    steady = spawn(steady_cgroup, steps)
    doomed.go()
    doomed.wait_line("looping")
    deadline = time.monotonic() + 10
    while probe.counters().get(doomed_cgroup.id, CgroupCounters(0)).ioctls < 1000:
        assert time.monotonic() < deadline, "the looping workload is not counted"
        time.sleep(0.01)
    steady.go()
    os.kill(doomed.pid, signal.SIGKILL)
    assert doomed.process.wait(timeout=10) == -signal.SIGKILL
    steady.report()

    got = collect(
        probe,
        lambda c: len(c.of(doomed_cgroup, "exit")) == 1 and len(c.of(steady_cgroup, "exit")) == 1,
    )
    assert got.of(doomed_cgroup, "exit")[0].pid == doomed.pid
    assert_counts(probe, steady_cgroup, expected)
    killed = probe.counters()[doomed_cgroup.id]
    assert killed.ioctls > 0
    assert sum(killed.latency_log2) == killed.ioctls

    # The probe still works after the kill: a fresh process in the same cgroup is counted.
    three_allocs = sequence(1)[0][2]
    assert three_allocs["times"] == 3
    again = spawn(doomed_cgroup, [{"open": "/dev/full", "as": "ctl"}, three_allocs])
    again.go()
    again.report()
    assert probe.counters()[doomed_cgroup.id].ioctls == killed.ioctls + 3


def test_exit_records_only_when_the_whole_process_exits(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    cgroup = make_cgroup()
    step = {"ioctl": "ctl", "cmd": RM_FREE, "arg": free(0xA3)}
    workload = spawn(
        cgroup, [{"open": "/dev/full", "as": "ctl"}, {"thread": [step]}, {"thread": [step]}, step]
    )
    workload.go()
    workload.report()
    got = collect(probe, lambda c: len(c.of(cgroup, "exit")) == 1)
    frees = got.of(cgroup, "ioctl")
    assert len(frees) == 3
    assert len({r.tid for r in frees}) == 3  # two threads that exited, then the main thread
    more = Collected(probe.poll(200))
    assert not more.of(cgroup, "exit")


def test_one_poll_takes_at_most_a_batch_and_the_rest_waits(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    """Else a flood keeps one ring buffer poll reading, and its caller never sees Ctrl-C."""
    if probe.features["output"] != "ringbuf":
        pytest.skip("no BPF ring buffer here: a perf buffer poll reads what it holds, no more")
    cgroup = make_cgroup()
    n = MAX_POLL_RECORDS + 1000
    timeslice = control(abi.NVA06C_CTRL_CMD_SET_TIMESLICE)  # streamed
    workload = spawn(
        cgroup,
        [
            {"open": "/dev/full", "as": "ctl"},
            {"ioctl": "ctl", "cmd": RM_CONTROL, "arg": timeslice, "times": n},
        ],
    )
    lost = probe.lost
    workload.go()
    workload.report()
    first = probe.poll(0)
    assert len(first) == MAX_POLL_RECORDS
    got = collect(probe, lambda c: len(c.of(cgroup, "exit")) == 1, into=Collected(first))
    assert len(got.of(cgroup, "ioctl")) == n
    assert probe.lost == lost  # all of them fitted: none was dropped for the bound


def test_a_thread_waiting_in_a_synchronize_call_keeps_its_cgroups_activity_moving(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn, fake_libcuda: Path
) -> None:
    """A loop waiting for a long kernel launches nothing while it runs; the rm enforcer's
    sensor must still see it busy (enforcers/rm/sensor.py). Each synchronize call entered
    counts once, and each read that finds a thread inside one moves the count again."""
    assert set(str(probe.features["sync_symbols"]).split(",")) == {
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuStreamSynchronize",
    }
    assert probe.features["sync_uprobes"] == "3"
    lib = str(fake_libcuda)
    cg = make_cgroup()
    waiter = spawn(
        cg,
        [
            {"launch": "cuCtxSynchronize", "lib": lib},
            {"say": "stream"},
            {"launch": "cuStreamSynchronize", "lib": lib},  # 0.4 s inside
            {"say": "event"},
            {"launch": "cuEventSynchronize", "lib": lib},  # cuCtxSynchronize, then 0.4 s
        ],
    )

    def reads(n: int) -> list[int]:
        return [probe.launches_of([cg.id])[cg.id] for _ in range(n)]

    waiter.go()
    waiter.wait_line("stream")
    time.sleep(0.1)
    stream = reads(3)
    assert stream[0] < stream[1] < stream[2]  # moving at every read while it waits
    waiter.wait_line("event")
    time.sleep(0.1)
    # Still waiting after the call inside it returned.
    event = reads(2)
    assert event[0] < event[1]
    assert probe.counters()[cg.id].launches == 0  # and no launch counted for it
    waiter.report()
    after = probe.launches_of([cg.id])[cg.id]
    assert probe.launches_of([cg.id])[cg.id] == after  # returned: still again
    # Three waits (the one inside another is part of it) and the five reads that found one.
    assert after == 3 + 5
    assert probe.launches()[cg.id] == after
    assert probe.counters()[cg.id].waits == 3 and probe.cuda_calls[cg.id] == (0, 3, 0)


def test_a_thread_inside_a_synchronous_copy_waits_for_its_gpu_work(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn, fake_libcuda: Path
) -> None:
    """kernel<<<...>>>; cudaMemcpy(..., D2H): the copy waits for the kernel before it, and the
    process launches nothing and waits in no synchronize call meanwhile. A synchronous copy is
    a wait; an Async one returns at once and is not."""
    assert set(str(probe.features["copy_symbols"]).split(",")) == {"cuMemcpyDtoH_v2"}
    assert probe.features["copy_uprobes"] == "1"
    lib = str(fake_libcuda)
    cg = make_cgroup()
    copier = spawn(
        cg,
        [
            {"launch": "cuMemcpyDtoHAsync_v2", "lib": lib, "times": 4},
            {"say": "copy"},
            {"launch": "cuMemcpyDtoH_v2", "lib": lib},  # 0.4 s inside
        ],
    )
    copier.go()
    copier.wait_line("copy")
    time.sleep(0.1)
    inside = [probe.launches_of([cg.id])[cg.id] for _ in range(3)]
    assert inside[0] < inside[1] < inside[2]
    copier.report()
    assert probe.counters()[cg.id].waits == 1  # the synchronous copy; no Async one


def test_a_query_answered_not_ready_moves_its_cgroups_activity_and_one_answered_done_does_not(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn, fake_libcuda: Path
) -> None:
    """A loop that polls cuStreamQuery while its long kernel runs launches nothing and waits in
    no synchronize call: each "not ready" is its work still on the GPU. The stand-in's stream
    query answers CUDA_ERROR_NOT_READY five times, then done; its event query always done."""
    assert set(str(probe.features["query_symbols"]).split(",")) == {"cuEventQuery", "cuStreamQuery"}
    assert probe.features["query_uprobes"] == "2"
    lib = str(fake_libcuda)
    polling, done = make_cgroup(), make_cgroup()
    poller = spawn(polling, [{"launch": "cuStreamQuery", "lib": lib, "times": 9}])
    finished = spawn(done, [{"launch": "cuEventQuery", "lib": lib, "times": 9}])
    poller.go()
    finished.go()
    poller.report()
    finished.report()
    assert probe.launches_of([polling.id]) == {polling.id: 5}
    assert probe.launches()[polling.id] == 5
    counted = probe.counters()[polling.id]
    assert (counted.launches, counted.waits, counted.polls) == (0, 0, 5)  # polls, not launches
    assert probe.cuda_calls[polling.id] == (0, 0, 5)
    # Done answers leave no count (the cgroup has no entry at all, or a still one).
    assert probe.launches_of([done.id]).get(done.id, 0) == 0


def test_launches_are_counted_per_cgroup(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn, fake_libcuda: Path
) -> None:
    assert probe.features["libcuda"] == str(fake_libcuda.resolve())
    names = str(probe.features["launch_symbols"]).split(",")
    assert {"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuGraphLaunch"} <= set(
        names
    )
    assert "cuMemAlloc" not in names
    assert probe.features["launch_uprobes"] == "4"  # cuLaunchKernelEx_ptsz is an alias
    lib = str(fake_libcuda)

    def calls(n: int) -> list[dict[str, Any]]:
        return [
            {"launch": "cuLaunchKernel", "lib": lib, "times": 7 * n},
            {"launch": "cuLaunchKernel_ptsz", "lib": lib, "times": 2 * n},
            {"launch": "cuLaunchKernelEx", "lib": lib, "times": n},
            {"launch": "cuLaunchKernelEx_ptsz", "lib": lib, "times": n},  # alias: same address
            {"launch": "cuGraphLaunch", "lib": lib, "times": 3 * n},
            {"launch": "cuMemAlloc", "lib": lib, "times": 5},  # not a launch
        ]

    a, b = make_cgroup(), make_cgroup()
    first, second = spawn(a, calls(1)), spawn(b, calls(10))
    first.go()
    second.go()
    first.report()
    second.report()
    counters = probe.counters()
    assert counters[a.id].launches == 14
    assert counters[b.id].launches == 140
    assert counters[a.id].ioctls == 0
    # The rm enforcer's per-poll read (in batches) agrees with the counters, and so does the
    # one-by-one read it falls back to where the kernel has no batch lookup.
    batched = probe.launches()
    assert (batched[a.id], batched[b.id]) == (14, 140)
    # The look at a holder reads its cgroups one by one: the same counts, none for a cgroup that
    # never launched.
    assert probe.launches_of([b.id, 987654321]) == {b.id: 140}
    probe._batch_lookup = False
    try:
        assert probe.launches() == batched
        assert probe.counters() == counters
    finally:
        probe._batch_lookup = True


@pytest.mark.parametrize(
    ("output", "group_dead"), [("perf", "task"), ("ringbuf", "task"), ("perf", "tracepoint")]
)
def test_fallbacks_stream_the_same_records(
    output: str,
    group_dead: str,
    make_cgroup: MakeCgroup,
    spawn: Spawn,
) -> None:
    """The perf buffer (kernels without a ring buffer) and the task->signal->live exit check
    (kernels whose sched_process_exit has no group_dead) give the same records."""
    if group_dead == "tracepoint" and "group_dead" not in (
        Path("/sys/kernel/tracing/events/sched/sched_process_exit/format").read_text()
    ):
        pytest.skip("this kernel's sched_process_exit has no group_dead field")
    cgroup = make_cgroup()
    with NvProbe(
        DeviceFilter.parse(TEST_DEVICES),
        libcuda=None,
        output=output,  # type: ignore[arg-type]
        group_dead=group_dead,  # type: ignore[arg-type]
    ) as other:
        assert other.features["output"] == output
        assert other.features["group_dead"] == group_dead
        step = {"ioctl": "ctl", "cmd": RM_FREE, "arg": free(0xA4)}
        workload = spawn(
            cgroup, [{"open": "/dev/full", "as": "ctl"}, {"thread": [step]}, step, {"close": "ctl"}]
        )
        workload.go()
        workload.report()
        got = collect(other, lambda c: len(c.of(cgroup, "exit")) == 1)
        assert Counter(r.kind for r in got.of(cgroup)) == {
            "open": 1,
            "ioctl": 2,
            "close": 1,
            "exit": 1,
        }
        assert other.counters()[cgroup.id].escapes == {"RM_FREE": 2}
        assert other.lost == 0


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


@pytest.mark.parametrize("multi", [True, False])
def test_libcudas_uprobes_count_the_same_as_links_or_as_perf_events(
    multi: bool, make_cgroup: MakeCgroup, spawn: Spawn, fake_libcuda: Path, tmp_path: Path
) -> None:
    """A uprobe-multi link per program (Linux 6.6+: 1.2-1.3 s to tear the probe down on an
    H200, against 12-13 s for 100 perf events, tools/gpu/probe_teardown.py) and the perf events
    the probe falls back to count launches, waits and queries alike.

    On a copy of the stand-in libcuda (another inode): the kernel refuses two consumers of one
    uprobe whose reference counter offsets differ, and bcc 0.26's Python binding leaves that
    argument of bpf_attach_uprobe out (whatever the register held: 6 here, per dmesg's
    "ref_ctr_offset mismatch"), so its perf events cannot share a function with a link made
    with none, as the session's probe has."""
    copy = tmp_path / "libcuda.so.1"
    shutil.copyfile(fake_libcuda, copy)
    lib = str(copy)
    cgroup = make_cgroup()
    with NvProbe(DeviceFilter.parse(TEST_DEVICES), libcuda=copy, uprobe_multi=multi) as p:
        bcc_uprobes = len(p._loaded().uprobe_fds)
        if multi and _kernel_at_least(6, 6):
            # One link per program and direction: launch entry; sync and copy entry and return
            # (one program each); query return.
            assert p.features["uprobe_multi"] == "yes" and len(p._links) == 6
            assert bcc_uprobes == 0
        elif multi:
            assert str(p.features["uprobe_multi"]).startswith("refused")
        else:
            assert "uprobe_multi" not in p.features and p._links == []
            assert bcc_uprobes == 4 + 3 * 2 + 1 * 2 + 2  # one perf event per uprobe
        workload = spawn(
            cgroup,
            [
                {"launch": "cuLaunchKernel", "lib": lib, "times": 7},
                {"launch": "cuGraphLaunch", "lib": lib, "times": 3},
                {"launch": "cuStreamSynchronize", "lib": lib},
            ],
        )
        workload.go()
        workload.report()
        counters = p.counters()[cgroup.id]
        assert (counters.launches, counters.waits) == (10, 1)
    assert p._links == [] and p._multi_programs == {}


def test_a_muted_process_is_counted_and_not_streamed(
    probe: NvProbe, make_cgroup: MakeCgroup, spawn: Spawn
) -> None:
    """The daemon mutes itself: its searches' checks make and free a client per client handle
    (60 000 records for 30 000 checks, call 24D), none of them a tenant's."""
    steps: list[dict[str, Any]] = [
        {"open": "/dev/full", "as": "ctl"},
        {"ioctl": "ctl", "cmd": RM_ALLOC_32, "arg": alloc32(0xB2, abi.NV01_ROOT_CLIENT)},
        {"ioctl": "ctl", "cmd": RM_FREE, "arg": free(0xB2)},
        {"close": "ctl"},
    ]
    quiet, loud = make_cgroup(), make_cgroup()
    muted = spawn(quiet, steps)
    heard = spawn(loud, steps)
    probe.mute(muted.pid)
    for workload in (muted, heard):
        workload.go()
        workload.report()
    got = collect(probe, lambda c: len(c.of(quiet, "exit")) == 1 and len(c.of(loud, "exit")) == 1)
    assert [r.cmd for r in got.of(loud, "ioctl")] == [RM_ALLOC_32, RM_FREE]
    assert got.of(quiet, "ioctl") == []
    # Its opens, closes and exit are still streamed, and its ioctls counted.
    assert Counter(r.kind for r in got.of(quiet)) == {"open": 1, "close": 1, "exit": 1}
    counters = probe.counters()
    assert counters[quiet.id].escapes == counters[loud.id].escapes == {"RM_ALLOC": 1, "RM_FREE": 1}
