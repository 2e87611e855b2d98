"""tools/gpu/sched_only.py against a stand-in GPU whose two kinds of close differ: what each
close, phase and online request is credited with, and that the GPU is left as found."""

from __future__ import annotations

from typing import Any

import pytest

from qpolicy.doctor.lab import Lab
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu import sched_only

MATMUL_S = {"a": 0.0014, "b": 0.0014, "loop": 0.1}  # each alone; those running share the GPU
STEP_S = 0.0002
CLOSE_US = {False: 800.0, True: 100.0}  # full, sched-only
OPEN_US = 500.0
TSG = {"a": 0x10, "b": 0x20, "online": 0x30, "loop": 0x40}
TRAINERS = ("a", "b", "loop")


def group(name: str) -> ClientChannels:
    tsg = TSG[name]
    return ClientChannels(
        pid=tsg, cgroup=None, fd=8, client=tsg, subdevice=0x5C000003,
        channels=(tsg + 1,), tsgs=(tsg,), compute_tsgs=(tsg,),
    )  # fmt: skip


class Samples:
    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []

    def between(self, start: float, end: float) -> list[tuple[float, float]]:
        return [s for s in self.samples if start <= s[0] < end]


class Online:
    """150 Hz requests; one released from 1 ms before a close to 3 ms after it takes 2 ms,
    any other 0.5 ms."""

    def __init__(self, gpu: StandInGpu) -> None:
        self.gpu = gpu
        self.slots: list[float] = []

    def between(self, start: float, end: float) -> list[tuple[float, float]]:
        def ms(t: float) -> float:
            near = any(-0.001 <= t - c <= 0.003 for c in self.gpu.close_starts)
            return 2.0 if near else 0.5

        return [(t, ms(t)) for t in self.slots if start <= t < end]


class StandInGpu:
    """A full close takes a trainer off at once (a CILP save); a sched-only close lets it finish
    the kernel it runs where it is alone on the GPU (no save), and stops it at once (saved) when
    another trainer is opened."""

    def __init__(self) -> None:
        self.now = 1000.0
        # Closes nest, opens stop at none (measured on an H200: tools/gpu/disable_nesting.py).
        self.closes = dict.fromkeys(TSG, 0)
        self.lingering: set[str] = set()  # closed sched-only, still running alone
        self.trainers = {name: Samples() for name in TRAINERS}
        self.online = Online(self)
        self.progress = dict.fromkeys(TRAINERS, 0.0)
        self.done = dict.fromkeys(TRAINERS, 0)
        self.next_slot = self.now
        self.online_started = False
        self.close_starts: list[float] = []
        self.cilp = dict.fromkeys(TSG.values(), 0)
        self.timeslice = dict.fromkeys(TSG.values(), 2048)

    def clock(self) -> float:
        return self.now

    def _running(self) -> list[str]:
        return [n for n in TRAINERS if not self.closes[n] or n in self.lingering]

    def _advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            dt = min(STEP_S, end - self.now)
            self.now += dt
            running = self._running()
            for name in running:
                self.progress[name] += dt / (MATMUL_S[name] * len(running))
                if self.progress[name] >= 1.0:
                    self.progress[name] -= 1.0
                    self.done[name] += 1
                    self.trainers[name].samples.append((self.now, float(self.done[name])))
                    self.lingering.discard(name)  # its kernel done: not scheduled again
            while self.online_started and self.next_slot <= self.now:
                self.online.slots.append(self.next_slot)
                self.next_slot += 1 / 150

    def sleep(self, seconds: float) -> None:
        self._advance(seconds)

    def disable(
        self,
        fd: int,
        client: int,
        subdevice: int,
        channels: tuple[int, ...],
        *,
        disable: bool,
        only_scheduling: bool = False,
    ) -> rmctl.ControlResult:
        name = next(n for n, t in TSG.items() if t + 1 == channels[0])
        if disable:
            self.close_starts.append(self.now)
            self._advance(CLOSE_US[only_scheduling] / 1e6)
            if not self.closes[name]:
                others_open = [n for n in TRAINERS if n != name and not self.closes[n]]
                if only_scheduling and not others_open:
                    self.lingering.add(name)
                else:
                    self.cilp[TSG[name]] += 1
            self.closes[name] += 1
        else:
            self._advance(OPEN_US / 1e6)
            self.closes[name] = max(0, self.closes[name] - 1)
            if self.closes[name]:
                return rmctl.ControlResult(abi.NvStatus.NV_OK, 1000)
            self.lingering.discard(name)
            for other in list(self.lingering):  # another TSG has work: a lingering one stops
                self.lingering.discard(other)
                self.cilp[TSG[other]] += 1
        return rmctl.ControlResult(abi.NvStatus.NV_OK, 1000)

    def send(self, fd: int, client: int, obj: int, cmd: int, **fields: int) -> tuple[Any, dict]:
        ok = rmctl.ControlResult(abi.NvStatus.NV_OK, 1000)
        if cmd == abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS:
            n = self.cilp[fields["hChannel"]]
            return ok, {"saveCnt": n, "wfiSaveCnt": 0, "ctaSaveCnt": 0, "cilpSaveCnt": n}
        if cmd == abi.NVA06C_CTRL_CMD_GET_TIMESLICE:
            return ok, {"timesliceUs": self.timeslice[obj]}
        assert cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE
        self.timeslice[obj] = fields["timesliceUs"]
        return ok, dict(fields)


class Files:
    def get(self, pid: int, fd: int) -> int:
        return 1000 + pid


def stand_in_rig() -> tuple[StandInGpu, sched_only.Rig]:
    gpu = StandInGpu()
    lab = Lab(0, handles=None, files=Files(), send=gpu.send)  # type: ignore[arg-type]
    rig = sched_only.Rig(
        lab, {n: [group(n)] for n in TRAINERS}, clock=gpu.clock, sleep=gpu.sleep,
        disable=gpu.disable,
    )  # fmt: skip
    return gpu, rig


@pytest.fixture(scope="module")
def measured() -> tuple[StandInGpu, dict[str, Any]]:
    gpu, rig = stand_in_rig()

    def start_online() -> Online:
        # Started once the stop closes and hand-overs are done, each workload closed only where
        # it was open: for A's stops B and the loop, for the loop's A, and 2 timeslices x 2
        # kinds x 3 closes each; per kind of hand-over 3 of the loop and 3 of A; then the loop
        # closed for the turns.
        assert gpu.online.slots == []
        assert len(gpu.close_starts) == (2 + 12) + (1 + 12) + 2 * (3 + 3) + 1
        gpu.next_slot, gpu.online_started = gpu.now, True
        rig.groups["online"] = [group("online")]
        return gpu.online

    result = sched_only.measure(
        rig, start_online, gpu.trainers,  # type: ignore[arg-type]
        closes=3, grace_s=0.02, watch_s=0.1, seconds=1.0, turn_s=0.05, rounds=1,
    )  # fmt: skip
    return gpu, result


def test_each_close_of_a_trainer_alone_is_credited_with_its_cost_saves_and_work_after(
    measured: tuple[StandInGpu, dict[str, Any]],
) -> None:
    _, result = measured
    stop = result["stop"]
    assert list(stop) == [
        f"{name} {kind}@{ts}"
        for name in ("a", "loop")
        for ts in ("own", "1us")
        for kind in ("full", "sched-only")
    ]
    for name in ("a", "loop"):
        for close in stop[f"{name} full@1us"]:
            assert close["us"] == pytest.approx(800, abs=1)
            assert close["saves_across"]["cilp"] == 1 and close["saves_after"]["cilp"] == 0
            assert close["done_after"] == 0
            assert close["next_done_ms"] is None  # none until opened again
        for close in stop[f"{name} sched-only@1us"]:
            assert close["us"] == pytest.approx(100, abs=1)
            assert close["saves_across"]["cilp"] == 0  # left to finish its kernel: no save
            assert close["next_done_ms"] <= 1000 * MATMUL_S[name]
    assert all(c["done_before"] >= 70 and c["done_after"] == 0 for c in stop["a sched-only@own"])
    assert all(c["done_before"] == 1 for c in stop["loop full@own"])
    assert result["own_timeslices_us"] == {"a": [2048], "loop": [2048]}


def test_a_hand_over_from_the_loop_is_credited_with_what_the_loop_did_after_it(
    measured: tuple[StandInGpu, dict[str, Any]],
) -> None:
    _, result = measured
    handover = result["handover"]
    assert list(handover) == ["loop to a full", "loop to a sched-only"]
    for kind, us in (("full", 800.0), ("sched-only", 100.0)):
        for close in handover[f"loop to a {kind}"]:
            assert close["us"] == pytest.approx(us, abs=1)
            assert close["open_us"] == pytest.approx(OPEN_US, abs=1)
            # The stand-in stops a lingering TSG as another is opened: saved, nothing after.
            assert close["saves_across"]["cilp"] == 1 and close["done_after"] == 0
            assert close["next_done_ms"] is None and close["new_done"] >= 70
    assert "| loop to a sched-only x3 | 100 | 3 / 0 | 0 | - (0 of 3) |" in sched_only.summary(
        result
    )


def test_turn_phases_credit_closes_closed_work_and_the_requests_near_a_close(
    measured: tuple[StandInGpu, dict[str, Any]],
) -> None:
    _, result = measured
    phases = {p["kind"]: p for p in result["turns"]}
    assert [p["kind"] for p in result["turns"]] == ["solo", "one", "full", "sched-only"]
    assert phases["solo"]["trainers"]["a"]["done"] <= 1 and "online_by_close" not in phases["solo"]
    one = phases["one"]
    assert one["closes"]["n"] == 1 and "online_by_close" not in one
    assert 650 < one["trainers"]["a"]["done"] < 720 and one["trainers"]["b"]["done"] <= 1
    for kind, us in (("full", 800.0), ("sched-only", 100.0)):
        phase = phases[kind]
        assert phase["closes"]["n"] >= 19 and phase["closes"]["p50_us"] == pytest.approx(us, abs=1)
        for trainer in phase["trainers"].values():
            # Handed over: each ran about half the phase, alone, and nothing while closed (its
            # ten closed spans counted from 20 ms after each close).
            assert trainer["done_while_closed"] == 0
            assert 0.25 < trainer["closed_s"] < 0.35
            assert 300 < trainer["done"] < 400
        split = phase["online_by_close"]
        near, away = split["near_close"], split["elsewhere"]
        assert near["requests"] + away["requests"] == phase["online"]["requests"]
        assert near["over_1ms"] == near["requests"] > 0 and away["over_1ms"] == 0
        assert near["p50_ms"] == 2.0 and away["p99_ms"] == 0.5


def test_the_gpu_is_left_open_at_its_own_timeslices(
    measured: tuple[StandInGpu, dict[str, Any]],
) -> None:
    gpu, result = measured
    assert not any(gpu.closes.values()) and not gpu.lingering
    assert gpu.timeslice == dict.fromkeys(TSG.values(), 2048)
    text = sched_only.summary(result)
    assert "| a sched-only@1us x3 | 100 | 0 / 0 |" in text
    assert "| full |" in text and "| sched-only |" in text


def test_matmuls_are_counted_from_the_done_counts_and_turns_may_be_left_out() -> None:
    samples = [(1.0, 4.0), (2.0, 8.0), (3.0, 12.0), (4.0, 16.0)]
    assert sched_only.finished(samples, 1.5, 3.5) == 8  # two waits of four matmuls
    assert sched_only.finished(samples, 0.0, 1.0) == 0
    gpu, rig = stand_in_rig()

    def never() -> Online:
        raise AssertionError("the online stream is started only for the turns")

    result = sched_only.measure(
        rig, never, gpu.trainers,  # type: ignore[arg-type]
        closes=1, grace_s=0.02, watch_s=0.1, seconds=1.0, turn_s=0.05, rounds=1,
        stops=("a",), handovers=None, turns=False,
    )  # fmt: skip
    assert list(result["stop"]) == [
        "a full@own",
        "a sched-only@own",
        "a full@1us",
        "a sched-only@1us",
    ]
    assert result["handover"] == {} and result["turns"] == []
    assert not any(gpu.closes.values())  # left open


def test_a_close_rm_refuses_is_named() -> None:
    def refuse(*args: Any, **kwargs: Any) -> rmctl.ControlResult:
        return rmctl.ControlResult(abi.NvStatus.NV_ERR_INVALID_ARGUMENT, 1000)

    lab = Lab(0, handles=None, files=Files(), send=None)  # type: ignore[arg-type]
    rig = sched_only.Rig(lab, {"a": [group("a")]}, disable=refuse)
    with pytest.raises(RuntimeError, match="FIFO_DISABLE_CHANNELS on a: 0x"):
        rig.set_open("a", False, True)
