"""tools/gpu/ctxsw_saves.py against a stand-in GPU: what each phase and each close is credited
with, and that the GPU is left as found (timeslices restored, the trainer open)."""

from __future__ import annotations

from typing import Any

from qpolicy.doctor.lab import Lab
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu import ctxsw_saves

LOOP, TRAINER, IDLE = 0x10, 0x20, 0x30  # each workload's compute TSG


def group(client: int, tsg: int) -> ClientChannels:
    return ClientChannels(
        pid=client, cgroup=None, fd=8, client=client, subdevice=0x5C000003,
        channels=(tsg + 1,), tsgs=(tsg, tsg + 2), compute_tsgs=(tsg,),
    )  # fmt: skip


class StandInGpu:
    """Two TSGs with work switch while both are open: the loop's context is saved mid-kernel
    (CILP) 100 times a second at its own timeslice, 2 000 at 1 us, the trainer's likewise. A
    close saves a TSG with work by CILP, one with nothing to run by nothing at all."""

    def __init__(self) -> None:
        self.counts = {tsg: dict.fromkeys(("saveCnt", "wfiSaveCnt", "ctaSaveCnt", "cilpSaveCnt"), 0)
                       for tsg in (LOOP, TRAINER, IDLE)}  # fmt: skip
        self.closed: set[int] = set()
        self.timeslice: dict[int, int] = {}
        self.disables = 0

    def _save(self, tsg: int, n: int) -> None:
        self.counts[tsg]["saveCnt"] += n
        self.counts[tsg]["cilpSaveCnt"] += n

    def sleep(self, seconds: float) -> None:
        if LOOP not in self.closed and TRAINER not in self.closed:
            per_s = 2000 if self.timeslice.get(LOOP, 2048) == 1 else 100
            self._save(LOOP, int(seconds * per_s))
            self._save(TRAINER, int(seconds * per_s))

    def send(self, fd: int, client: int, obj: int, cmd: int, **fields: int) -> tuple[Any, dict]:
        ok = rmctl.ControlResult(abi.NvStatus.NV_OK, 1000)
        if cmd == abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS:
            return ok, {"hChannel": fields["hChannel"], **self.counts[fields["hChannel"]]}
        if cmd == abi.NVA06C_CTRL_CMD_GET_TIMESLICE:
            return ok, {"timesliceUs": self.timeslice.get(obj, 2048)}
        assert cmd == abi.NVA06C_CTRL_CMD_SET_TIMESLICE
        self.timeslice[obj] = fields["timesliceUs"]
        return ok, dict(fields)

    def disable(
        self, fd: int, client: int, subdevice: int, channels: tuple[int, ...], *, disable: bool
    ) -> rmctl.ControlResult:
        self.disables += 1
        tsg = channels[0] - 1
        if disable and tsg not in self.closed and tsg in (LOOP, TRAINER):
            self._save(tsg, 1)  # taken off mid-kernel
        (self.closed.add if disable else self.closed.discard)(tsg)
        return rmctl.ControlResult(abi.NvStatus.NV_OK, 1000)


class Files:
    def get(self, pid: int, fd: int) -> int:
        return 1000 + pid


def test_each_phase_and_close_is_credited_with_its_own_saves_and_the_gpu_is_left_as_found() -> None:
    gpu = StandInGpu()
    lab = Lab(0, handles=None, files=Files(), send=gpu.send)  # type: ignore[arg-type]
    groups = {"loop": [group(1, LOOP)], "trainer": [group(2, TRAINER)], "idle": [group(3, IDLE)]}
    s = ctxsw_saves.Saves(lab, groups, sleep=gpu.sleep, disable=gpu.disable)
    result = ctxsw_saves.measure(s, seconds=2.0, closes=5)
    phases = result["phases"]
    assert phases["alone"]["loop"] == {"all": 0, "wfi": 0, "cta": 0, "cilp": 0}
    assert phases["beside"]["loop"]["cilp"] == 200 and phases["beside"]["trainer"]["cilp"] == 200
    assert phases["beside-1us"]["loop"]["cilp"] == 4000
    assert all(d == 0 for d in phases["beside"]["idle"].values())
    assert result["closes"]["loop"] == [{"all": 1, "wfi": 0, "cta": 0, "cilp": 1}] * 5
    assert result["closes"]["idle"] == [{"all": 0, "wfi": 0, "cta": 0, "cilp": 0}] * 5
    # Left as found: every TSG's own timeslice back, every workload open.
    assert gpu.timeslice == {LOOP: 2048, LOOP + 2: 2048, TRAINER: 2048, TRAINER + 2: 2048}
    assert not gpu.closed
    summary = ctxsw_saves._summary(result)
    assert "| 5 closes | loop | 5 | 0 | 0 | 5 |" in summary
