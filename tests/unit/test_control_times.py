"""tools/gpu/control_times.py against a fake RM: each control leaves the context as it found it,
and the queue study sees a wait where the fake RM holds one lock across its GSP controls."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from qpolicy.doctor.lab import Call
from qpolicy.nvrm import abi
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu.control_times import controls_of, measure, queue

GSP = {
    abi.NVA06C_CTRL_CMD_SET_TIMESLICE,
    abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES,
    abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
    abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS,
    abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
}


class TicketLock:
    """A lock taken in the order asked: threading.Lock lets the thread that let it go take it
    again first, and a fake RM built on it starves the other caller."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class FakeRm:
    """GSP's controls take ``gsp_s`` holding one lock; GET_TIMESLICE takes the lock, not the
    time (it waits for a GSP control, as RM's API lock would make it); NULL takes neither."""

    def __init__(self, gsp_s: float, serial: bool = True) -> None:
        self.gsp_s = gsp_s
        self.lock: Any = TicketLock() if serial else contextlib.nullcontext()
        self.timeslice = {0x11: 1024, 0x21: 1024}
        self.mode = 2
        self.disabled: set[int] = set()
        self.sent: list[tuple[int, dict[str, int]]] = []
        self.objects: set[tuple[int, int]] = set()  # (command, the object it went to)

    def control(
        self, group: ClientChannels, target: str, obj: int, cmd: int, **fields: int
    ) -> Call:
        start = time.perf_counter()
        answer: dict[str, Any] = {}
        with self.lock:
            self.sent.append((cmd, fields))
            self.objects.add((cmd, obj))
            if cmd in GSP:
                time.sleep(self.gsp_s)
            if cmd == abi.NVA06C_CTRL_CMD_GET_TIMESLICE:
                answer["timesliceUs"] = self.timeslice[obj]
            elif cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE:
                self.timeslice[obj] = fields["timesliceUs"]
            elif cmd == abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES:
                answer["cilpPreemptMode"] = self.mode
            elif cmd == abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE:
                self.mode = fields["cilpPreemptMode"]
            elif cmd == abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS:
                channels = {fields[f"hChannelList{i}"] for i in range(fields["numChannels"])}
                if fields["bDisable"]:
                    self.disabled |= channels
                else:
                    self.disabled -= channels
        return Call("", target, 0, (time.perf_counter() - start) * 1e6, answer)

    def null(self, group: ClientChannels) -> tuple[int, float]:
        return 0, 1.0


def group(client: int, tsg: int) -> ClientChannels:
    return ClientChannels(
        pid=1,
        cgroup=None,
        fd=3,
        client=client,
        subdevice=client + 1,
        channels=(tsg + 1, tsg + 2),
        tsgs=(tsg,),
        compute_tsgs=(tsg,),
        compute_channels=((tsg + 1, tsg),),
    )


def test_each_control_sends_back_what_it_read_and_the_enable_follows_the_disable() -> None:
    rm = FakeRm(0.0)
    rm.timeslice[0x11] = 2048
    result = measure(rm, group(0xC1, 0x11), 3)
    assert result["timeslice_us"] == 2048 and result["mode"] == "CILP"
    assert rm.timeslice[0x11] == 2048 and rm.mode == 2 and not rm.disabled
    timed = {name for name, value in result.items() if isinstance(value, dict)}
    assert {"GR_GET_CTXSW_STATS", "FIFO_DISABLE_CHANNELS", "FIFO_ENABLE_CHANNELS"} <= timed
    assert all(result[name]["us"]["n"] == 3 for name in timed)
    disables = [f for cmd, f in rm.sent if cmd == abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS]
    assert [f["bDisable"] for f in disables] == [1, 0] * 3
    assert disables[0]["hChannelList1"] == 0x13 and disables[0]["hClientList0"] == 0xC1
    stats = [f for cmd, f in rm.sent if cmd == abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS]
    assert stats[0]["hChannel"] == 0x11


def test_controls_of_says_why_where_rm_refused_the_reads() -> None:
    class Refusing(FakeRm):
        def control(self, *args: Any, **fields: int) -> Call:
            return Call("", "", 0x56, 1.0)

    assert controls_of(Refusing(0.0), group(0xC1, 0x11)) == "reads answered 0x56, 0x56"


def test_the_queue_study_sees_b_wait_behind_a_where_rm_holds_one_lock() -> None:
    rm = FakeRm(0.002)
    pairs = ((("SET_TIMESLICE",), "GET_TIMESLICE"), (("SET_TIMESLICE",), "NULL"))
    result = queue(rm, group(0xC1, 0x11), group(0xD1, 0x21), 40, pairs)
    waited = result["SET_TIMESLICE | GET_TIMESLICE"]
    assert waited["b_alone_us"]["p50"] < 500
    # Behind a 2 ms control sent back to back, half of one on average, at least.
    assert waited["b_beside_us"]["p50"] > 500
    assert waited["a_us"]["n"] > 0
    # NULL takes no lock: no wait.
    assert result["SET_TIMESLICE | NULL"]["b_beside_us"]["p50"] < 500
    assert rm.timeslice == {0x11: 1024, 0x21: 1024}


def test_the_queue_study_tells_controls_run_one_at_a_time_from_controls_run_side_by_side() -> None:
    pairs = ((("SET_TIMESLICE",), "SET_TIMESLICE"),)
    a, b = group(0xC1, 0x11), group(0xD1, 0x21)
    serial = queue(FakeRm(0.002), a, b, 30, pairs)["SET_TIMESLICE | SET_TIMESLICE"]
    side = queue(FakeRm(0.002, serial=False), a, b, 30, pairs, raw=True)
    both = side["SET_TIMESLICE | SET_TIMESLICE"]
    # One at a time: at most 500 a second together, and never two answers 1 ms apart or closer
    # at the median; side by side: both rates add up.
    assert serial["calls_per_s"] <= 520 and serial["answer_gap_us"]["p50"] > 1500
    assert both["calls_per_s"] > 800 and both["answer_gap_us"]["p10"] < 1000
    assert serial["b_beside_us"]["p50"] > 3000 and both["b_beside_us"]["p50"] < 3000
    assert len(both["raw"]["b"]) == 30 and both["raw"]["b"][0][0] == 0


def test_the_extra_controls_go_to_the_objects_that_export_them() -> None:
    rm = FakeRm(0.0)
    result = measure(rm, group(0xC1, 0x11), 2, extra=True)
    assert {"PREEMPT", "GPFIFO_SCHEDULE", "SET_INTERLEAVE_LEVEL", "MAKE_REALTIME"} <= set(result)
    sent = {(cmd, tuple(sorted(f.items()))) for cmd, f in rm.sent}
    assert (abi.NVA06F_CTRL_CMD_RESTART_RUNLIST, (("bBypassWait", 0), ("bForceRestart", 0))) in sent
    assert (abi.NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, (("tsgInterleaveLevel", 1),)) in sent
    # The channel's control to the compute channel, the TSG's to the TSG.
    assert (abi.NVA06F_CTRL_CMD_RESTART_RUNLIST, 0x12) in rm.objects
    assert (abi.NVA06C_CTRL_CMD_PREEMPT, 0x11) in rm.objects
    assert "PREEMPT" not in measure(FakeRm(0.0), group(0xC1, 0x11), 1)
