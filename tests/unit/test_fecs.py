"""The FECS trace's records as RM lays them out, and what the doctor reads from them: without a
GPU, records are packed here at the offsets of open-gpu-kernel-modules 580.142's headers."""

from __future__ import annotations

import os

import pytest

from qpolicy.nvrm import abi
from qpolicy.nvrm.fecs import (
    RECORD_TYPE_FECS_V2,
    FecsError,
    FecsTrace,
    Record,
    parse,
    request_waits,
    switches,
)

START, END = abi.FECS_TAG_SIMPLE_START, abi.FECS_TAG_SIMPLE_END


def test_the_layouts_are_the_headers() -> None:
    # cl90cd.h NV_EVENT_BUFFER_RECORD_HEADER (type u16, subtype u16, varData u32), then the
    # payload at 8; cl90cdfecs.h NV_EVENT_BUFFER_FECS_RECORD_V2: tag u8, vmid u8, seqno u16,
    # context_id u32, pid u32, reserved0 u16, two u8, timestamp u64 aligned to 8.
    offsets = {name: offset for name, offset, _ in abi.FECS_RECORD.fields}
    assert offsets == {"type": 0, "subtype": 2, "varData": 4, "tag": 8, "vmid": 9, "seqno": 10,
                       "context_id": 12, "pid": 16, "timestamp": 24}  # fmt: skip
    assert abi.FECS_RECORD.size == 32
    alloc = {name: offset for name, offset, _ in abi.NV_EVENT_BUFFER_ALLOC_PARAMETERS.fields}
    assert (alloc["recordSize"], alloc["hSubDevice"], alloc["hRecordBuffer"]) == (16, 52, 64)
    assert abi.NV_EVENT_BUFFER_ALLOC_PARAMETERS.size == 72
    bind = abi.CONTROLS[abi.NV2080_CTRL_CMD_GR_FECS_BIND_EVTBUF_FOR_UID_V2].params
    assert bind.size == 24 and {n: o for n, o, _ in bind.fields}["reasonCode"] == 20


def record(tag: int, pid: int, ns: int, context: int = 0x5C000020, seqno: int = 0) -> bytes:
    return abi.FECS_RECORD.pack(
        type=RECORD_TYPE_FECS_V2, tag=tag, pid=pid, timestamp=ns, context_id=context, seqno=seqno
    )


def test_records_are_read_from_get_to_put_across_the_end_of_the_ring() -> None:
    slots = [record(START, 7, 100, seqno=1), record(END, 7, 200, seqno=2),
             abi.FECS_RECORD.pack(type=99), record(START, 8, 300, seqno=3)]  # fmt: skip
    data = b"".join(slots)
    # get 2, put 1 in a ring of 4: slots 2 (another type, skipped), 3, 0.
    got = parse(data, 2, 1, 4)
    assert [(r.tag, r.pid, r.ns, r.seqno) for r in got] == [(START, 8, 300, 3), (START, 7, 100, 1)]
    assert parse(data, 1, 1, 4) == []


def test_switches_are_restores_after_the_trainers_save_and_the_runs_of_each() -> None:
    trainer, online, other = 10, 20, 30
    us = 1000  # the GPU's timer counts ns
    records = [
        Record(START, 0xA, trainer, 0, 0),
        Record(END, 0xA, trainer, 5_000 * us, 0),  # the trainer's save ended
        Record(START, 0xB, online, 5_080 * us, 0),  # the online context runs 80 µs later
        Record(END, 0xB, online, 5_400 * us, 0),
        Record(START, 0xA, trainer, 5_500 * us, 0),
        Record(START, 0xC, other, 6_000 * us, 0),  # another process's: left out
        Record(END, 0xA, trainer, 9_000 * us, 0),
        Record(START, 0xB, online, 9_120 * us, 0),
        Record(END, 0xB, online, 9_300 * us, 0),
    ]
    found = switches(reversed(records), {online}, {trainer})  # any order: sorted by time
    assert found["records"] == 9 and found["offline_to_online"] == 2
    assert found["restore_us"] == {"n": 2, "p50": 80.0, "p90": 120.0, "p99": 120.0, "mean": 100.0}
    assert found["online_run_us"] == {
        "n": 2,
        "p50": 180.0,
        "p90": 320.0,
        "p99": 320.0,
        "mean": 250.0,
    }
    assert found["offline_run_us"] == {"n": 2, "p50": 3500.0, "p90": 5000.0, "p99": 5000.0,
                                       "mean": 4250.0}  # fmt: skip
    # Without a trainer (solo), no restore after it.
    alone = switches(records, {online}, set())
    assert alone["offline_to_online"] == 0 and alone["restore_us"] is None


def test_without_a_gpu_the_trace_names_the_step_that_failed() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA GPU")
    trace = FecsTrace(0)
    with pytest.raises(FecsError) as caught:
        trace.open()
    assert caught.value.step == "open /dev/nvidiactl"
    assert str(caught.value).startswith("FECS trace: open /dev/nvidiactl: ")


def test_requests_are_placed_on_the_gpus_log_through_the_clocks_offset() -> None:
    trainer, online, offset, us = 10, 20, 7_000_000_000, 1000
    requests = [(1_000 * us, 1_600 * us), (9_000 * us, 9_500 * us), (20_000 * us, 20_300 * us)]
    records = []
    for launch, _ in requests[:2]:  # the third ran with no switch in it
        gpu = launch + offset
        records += [
            Record(END, 0xA, trainer, gpu + 120 * us, 0),
            Record(START, 0xB, online, gpu + 220 * us, 0),
            Record(END, 0xB, online, gpu + 450 * us, 0),
        ]
    # A save that ended before the launch belongs to no request.
    records.append(Record(END, 0xA, trainer, 19_990 * us + offset, 0))
    found = request_waits(records, offset, requests, {online}, {trainer})
    assert (found["requests"], found["placed"]) == (3, 2)
    assert found["launch_to_done_us"]["p50"] == 500.0 and found["launch_to_done_us"]["n"] == 3
    assert found["to_save_end_us"]["p50"] == 120.0 and found["to_start_us"]["p50"] == 220.0
    # A wrong offset (here the clocks taken as one) places nothing.
    assert request_waits(records, 0, requests, {online}, {trainer})["placed"] == 0
