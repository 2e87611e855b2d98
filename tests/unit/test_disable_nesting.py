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
