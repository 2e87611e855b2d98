"""tools/gpu/disable_nesting.py against two stand-in GPUs, one whose closes nest and one whose
do not: each step is credited with the matmuls of its own watch, and the two read apart."""

from __future__ import annotations

import pytest

from qpolicy.doctor.lab import Lab
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu import disable_nesting, sched_only

GROUP = ClientChannels(
    pid=7, cgroup=None, fd=8, client=0xC1D00001, subdevice=0x5C000003,
    channels=(0x5C000010,), tsgs=(0x5C00000F,), compute_tsgs=(0x5C00000F,),
)  # fmt: skip


class Trainer:
    """One matmul per ms while its channel runs."""

    def __init__(self, nests: bool) -> None:
        self.nests = nests
        self.now = 0.0
        self.closes = 0
        self.samples: list[tuple[float, float]] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.001
            if self.closes == 0:
                self.samples.append((self.now, float(len(self.samples) + 1)))

    def disable(self, fd: int, client: int, subdevice: int, channels: tuple[int, ...], *,
                disable: bool, only_scheduling: bool = False) -> rmctl.ControlResult:  # fmt: skip
        if self.nests:
            self.closes = max(0, self.closes + (1 if disable else -1))
        else:
            self.closes = int(disable)
        self.now += 0.0006
        return rmctl.ControlResult(abi.NvStatus.NV_OK, 600_000)


class Files:
    def get(self, pid: int, fd: int) -> int:
        return 100


@pytest.mark.parametrize("nests", [True, False])
def test_each_step_counts_the_matmuls_of_its_own_watch(nests: bool) -> None:
    gpu = Trainer(nests)
    lab = Lab(0, handles=None, files=Files(), send=None)  # type: ignore[arg-type]
    rig = sched_only.Rig(
        lab, {"trainer": [GROUP]}, clock=gpu.clock, sleep=gpu.sleep, disable=gpu.disable
    )
    steps = disable_nesting.run_steps(rig, "trainer", gpu, grace_s=0.02, watch_s=0.3)  # type: ignore[arg-type]
    done = {s["step"]: s["done"] for s in steps[:5]}
    assert done["open, nothing sent"] >= 299 and done["closed once"] == 0
    assert done["opened once"] >= 299 and done["closed twice"] == 0
    # The one difference: a channel closed twice runs after one open only where closes don't nest.
    assert (done["then opened once"] == 0) is nests
    assert [c["call"] for c in steps[9]["calls"]] == ["sched-only", "close"]
    assert all(c["us"] == pytest.approx(600, abs=1) for s in steps for c in s["calls"])
    assert gpu.closes == 0  # left running either way
    text = disable_nesting.summary(steps, 300)
    assert "| closed twice | close, close | 0 |" in text


class StallingTrainer(Trainer):
    """Closed sched-only, it stays stopped after opens until its timeslice is set (as an H200
    did with kernels queued, call 21E)."""

    def __init__(self) -> None:
        super().__init__(nests=True)
        self.stalled = False
        self.timeslice_sets = 0

    def sleep(self, seconds: float) -> None:
        closes, self.closes = self.closes, self.closes or int(self.stalled)
        super().sleep(seconds)
        self.closes = closes

    def disable(self, fd: int, client: int, subdevice: int, channels: tuple[int, ...], *,
                disable: bool, only_scheduling: bool = False) -> rmctl.ControlResult:  # fmt: skip
        self.stalled |= disable and only_scheduling
        return super().disable(fd, client, subdevice, channels, disable=disable)

    def send(self, fd: int, client: int, obj: int, cmd: int, **fields: int) -> tuple[object, dict]:
        ok = rmctl.ControlResult(abi.NvStatus.NV_OK, 1000)
        if cmd == abi.NVA06C_CTRL_CMD_GET_TIMESLICE:
            return ok, {"timesliceUs": 1024}
        assert cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE and fields["timesliceUs"] == 1024
        self.timeslice_sets += 1
        self.stalled = False
        self.now += 0.0005
        return ok, {}


def test_the_stall_steps_send_timeslices_and_waits_and_read_each_watch() -> None:
    gpu = StallingTrainer()
    lab = Lab(0, handles=None, files=Files(), send=gpu.send)  # type: ignore[arg-type]
    rig = sched_only.Rig(
        lab, {"trainer": [GROUP]}, clock=gpu.clock, sleep=gpu.sleep, disable=gpu.disable
    )
    steps = disable_nesting.run_steps(
        rig,
        "trainer",
        gpu,
        0.02,
        0.3,
        disable_nesting.STALL_STEPS,  # type: ignore[arg-type]
    )
    done = [s["done"] for s in steps]
    # Running; stalled through opens and a full close and open; woken by the timeslice only.
    assert done[0] >= 299 and done[1:5] == [0, 0, 0, 0] and done[5] >= 299
    assert gpu.timeslice_sets == 1
    assert [c["call"] for c in steps[5]["calls"]] == ["timeslice"]
    assert steps[7]["calls"] == []  # a wait sends nothing
