"""The FECS trace's records as RM lays them out, and what the doctor reads from them: without a
GPU, records are packed here at the offsets of open-gpu-kernel-modules 580.142's headers."""

from __future__ import annotations

import os
from typing import Any

import pytest

from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.fecs import (
    RECORD_TYPE_FECS_V2,
    FecsError,
    FecsTrace,
    Record,
    Request,
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
    assert found["launch_call_us"] is None and found["returned_to_save_end_us"] is None
    # A wrong offset (here the clocks taken as one) places nothing.
    assert request_waits(records, 0, requests, {online}, {trainer})["placed"] == 0
    # Where the workload says when its launch call returned: the call, and the rest of the way
    # to the save's end, for the requests placed.
    returned = [Request(launch, done, launch + 30 * us) for launch, done in requests]
    found = request_waits(records, offset, returned, {online}, {trainer})
    assert found["launch_call_us"] == {"n": 3, "p50": 30.0, "p90": 30.0, "p99": 30.0, "mean": 30.0}
    assert found["returned_to_save_end_us"]["n"] == 2
    assert found["returned_to_save_end_us"]["p50"] == 90.0


class Mapped(bytearray):
    """A mapping of the fake driver's memory."""

    def close(self) -> None:
        pass


class FakeDriver:
    """What FecsTrace asks of nvidia.ko, answered as RM would, and remembered."""

    def __init__(self, bus: tuple[int, int, int] = (0, 0x3B, 0)) -> None:
        self.allocs: list[tuple[int, int, int, bytes]] = []  # parent, handle, class, params
        self.maps: list[tuple[int, int, int]] = []  # device, memory, flags
        self.controls: list[tuple[int, int, dict[str, int]]] = []
        self.bus = bus
        self.header = Mapped(4096)
        self.records = Mapped(32768 * 32)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from qpolicy.nvrm import fecs, rmctl

        fds = iter(range(100, 200))
        monkeypatch.setattr(fecs.os, "open", lambda path, flags: next(fds))
        monkeypatch.setattr(fecs.os, "close", lambda fd: None)
        monkeypatch.setattr(rmctl, "register_fd", lambda device, ctl: 0)
        monkeypatch.setattr(rmctl, "alloc_client", lambda fd: 0xC1D00042)

        def alloc(fd: int, client: int, parent: int, handle: int, cls: int, params: bytes) -> int:
            self.allocs.append((parent, handle, cls, params))
            return 0

        def map_memory(fd: int, client: int, device: int, memory: int, length: int, flags: int,
                       target: int) -> int:  # fmt: skip
            self.maps.append((device, memory, flags))
            return 0

        def control(fd: int, client: int, obj: int, cmd: int, **fields: int) -> Any:
            self.controls.append((obj, cmd, fields))
            return rmctl.ControlResult(0, 1000), {**fields, "reasonCode": 0}

        monkeypatch.setattr(rmctl, "alloc", alloc)
        monkeypatch.setattr(rmctl, "map_memory", map_memory)
        monkeypatch.setattr(rmctl, "control", control)
        monkeypatch.setattr(
            rmctl, "gpu_pci_address", lambda fd, client, sub: rmctl.PciAddress(*self.bus)
        )
        mapped = iter([self.header, self.records])
        monkeypatch.setattr(fecs.mmap, "mmap", lambda *a, **k: next(mapped))


def test_the_trace_is_opened_in_the_order_rm_needs_and_refuses_another_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qpolicy.nvrm import fecs

    driver = FakeDriver()
    driver.install(monkeypatch)
    trace = FecsTrace(0, bus="0000:3b:00.0").open()
    classes = [(parent, cls) for parent, _, cls, _ in driver.allocs]
    client = 0xC1D00042
    assert classes == [
        (client, abi.NV01_DEVICE_0),
        (fecs.H_DEVICE, abi.NV20_SUBDEVICE_0),
        (client, abi.NV01_MEMORY_DEVICELESS),  # the header; deviceless memory is the client's
        (client, abi.NV01_MEMORY_DEVICELESS),  # the records
        (client, abi.NV_EVENT_BUFFER),
    ]
    memory = abi.NV_MEMORY_ALLOCATION_PARAMS.unpack(driver.allocs[3][3])
    assert memory["attr2"] == abi.NVOS32_ATTR2_PROTECTION_USER_READ_ONLY  # a user client's
    assert memory["size"] == 32768 * 32
    buffer = abi.NV_EVENT_BUFFER_ALLOC_PARAMETERS.unpack(driver.allocs[4][3])
    assert (buffer["hBufferHeader"], buffer["hRecordBuffer"], buffer["hSubDevice"]) == (
        fecs.H_HEADER, fecs.H_RECORDS, fecs.H_SUBDEVICE,
    )  # fmt: skip
    assert driver.maps == [(client, fecs.H_HEADER, 1), (client, fecs.H_RECORDS, 1)]
    bind, enable = driver.controls
    assert bind[:2] == (fecs.H_SUBDEVICE, abi.NV2080_CTRL_CMD_GR_FECS_BIND_EVTBUF_FOR_UID_V2)
    assert bind[2]["bAllUsers"] == 1 and bind[2]["hEventBuffer"] == fecs.H_BUFFER
    assert enable[:2] == (fecs.H_BUFFER, abi.NV_EVENT_BUFFER_CTRL_CMD_ENABLE_EVENTS)
    assert [s["step"] for s in trace.steps][-2:] == ["bind to GR", "enable"]
    # RM put two records since: read, then their slots handed back.
    driver.records[:64] = record(END, 7, 100) + record(START, 8, 190)
    driver.header[:32] = abi.NV_EVENT_BUFFER_HEADER.pack(recordGet=0, recordPut=2)
    assert [(r.tag, r.pid, r.ns) for r in trace.read()] == [(END, 7, 100), (START, 8, 190)]
    assert driver.controls[-1][1:] == (
        abi.NV_EVENT_BUFFER_CTRL_CMD_UPDATE_GET, {"recordBufferGet": 2, "varDataBufferGet": 0},
    )  # fmt: skip
    trace.close()
    # Device 0 of RM is another GPU than the one asked for: refused, not read.
    other = FakeDriver(bus=(0, 0x5E, 0))
    other.install(monkeypatch)
    with pytest.raises(FecsError) as caught:
        FecsTrace(0, bus="0000:3b:00.0").open()
    assert caught.value.step == "the device"
    assert "RM's device 0 is at 0000:5e:00, not 0000:3b:00.0" in str(caught.value)
    # Where RM gives no address, the trace is read and the step says so.
    unknown = FakeDriver()
    unknown.install(monkeypatch)
    monkeypatch.setattr(rmctl, "gpu_pci_address", lambda fd, client, sub: None)
    opened = FecsTrace(0, bus="0000:3b:00.0").open()
    assert {"step": "the device's PCI address", "address": "None"} in opened.steps
    opened.close()
