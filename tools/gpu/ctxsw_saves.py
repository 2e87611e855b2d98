"""What GR's context-save counters say about a TSG with work running and one with none.

The rm enforcer checks a pod that reads idle while open on the GPU: a save of its TSG by CILP or
CTA (GR_GET_CTXSW_STATS) between two reads means it was taken off the engine mid-work
(qpolicy/enforcers/rm/sensor.py); qgpu.ko could tell an owed cgroup the same way
(kmod/qgpu/userd.c). This measures the counters on a GPU, for three processes of the doctor's
workloads (qpolicy/doctor/workload.py): a loop of 32768 bf16 matmuls (~0.1 s each) launched one
after another, each waited for; an 8192 trainer; and an idle process (a context with nothing to
run). Per phase, the saves of each one's compute TSGs by kind (all, WFI, CTA, CILP):

- ``alone``: the trainer closed (FIFO_DISABLE_CHANNELS), the loop alone on the GPU;
- ``beside``: the trainer open beside it, at the TSGs' own timeslices;
- ``beside-1us``: the same at 1 us (qpolicy's offline timeslice), restored after;
- ``closes``: the trainer closed; the loop closed and opened again ``--closes`` times, and the
  idle process likewise: what one close (bOnlyDisableScheduling=0, running work taken off)
  saves, per close.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/ctxsw_saves.py --gpu 0 --out ctxsw-saves.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.doctor.lab import SAVE_KINDS, Lab, Workload, workload_argv
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels


def saves(lab: Lab, groups: list[ClientChannels]) -> dict[str, int]:
    """The saves of ``groups``' compute TSGs (every TSG where none is known), summed by kind."""
    total = dict.fromkeys((name for _, name in SAVE_KINDS), 0)
    for group in groups:
        for tsg in group.compute_tsgs or group.tsgs:
            counts = lab.saves(group, tsg, f"TSG {tsg:#x}")
            if counts is None:
                raise RuntimeError(f"GR_GET_CTXSW_STATS on TSG {tsg:#x}: refused")
            for name, count in counts.items():
                total[name] += count
    return total


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {kind: after[kind] - before[kind] for kind in before}


def set_timeslices(
    lab: Lab, groups: list[ClientChannels], before: dict[tuple[int, int], int], us: int | None
) -> None:
    """``us`` on every TSG of ``groups``; None: the value each had before this first changed it
    (read with GET_TIMESLICE into ``before``, by client and TSG)."""
    for group in groups:
        for tsg in group.tsgs:
            key = (group.client, tsg)
            if key not in before:
                call = lab.control(group, f"TSG {tsg:#x}", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE)
                before[key] = call.answer.get("timesliceUs", 0)
            value = before[key] if us is None else us
            lab.control(
                group, f"TSG {tsg:#x}", tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, timesliceUs=value
            )


class Saves:
    """The three workloads' groups, and the levers this measurement pulls on them."""

    def __init__(
        self,
        lab: Lab,
        groups: dict[str, list[ClientChannels]],
        sleep: Callable[[float], None] = time.sleep,
        disable: Callable[..., rmctl.ControlResult] = rmctl.disable_channels,
    ) -> None:
        self.lab = lab
        self.groups = groups
        self.sleep = sleep
        self._disable = disable
        self._timeslices: dict[tuple[int, int], int] = {}

    def read(self) -> dict[str, dict[str, int]]:
        return {name: saves(self.lab, groups) for name, groups in self.groups.items()}

    def set_open(self, name: str, is_open: bool) -> None:
        for group in self.groups[name]:
            assert group.pid is not None and group.fd is not None and group.subdevice is not None
            fd = self.lab.files.get(group.pid, group.fd)
            result = self._disable(
                fd, group.client, group.subdevice, group.channels, disable=not is_open
            )
            if not result.ok:
                raise RuntimeError(f"FIFO_DISABLE_CHANNELS on {name}: {result.status:#x}")

    def set_timeslice(self, name: str, us: int | None) -> None:
        """``us`` on every TSG of ``name``; None: the value each had before."""
        set_timeslices(self.lab, self.groups[name], self._timeslices, us)

    def phase(self, seconds: float) -> dict[str, dict[str, int]]:
        before = self.read()
        self.sleep(seconds)
        after = self.read()
        return {name: delta(before[name], after[name]) for name in before}

    def closes(self, name: str, count: int, open_s: float) -> list[dict[str, int]]:
        """What each of ``count`` closes of ``name`` saved: read, close, read, open, wait."""
        per_close = []
        for _ in range(count):
            before = saves(self.lab, self.groups[name])
            self.set_open(name, False)
            after = saves(self.lab, self.groups[name])
            self.set_open(name, True)
            per_close.append(delta(before, after))
            self.sleep(open_s)
        return per_close


def measure(s: Saves, seconds: float, closes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"phases": {}}
    s.set_open("trainer", False)
    out["phases"]["alone"] = s.phase(seconds)
    s.set_open("trainer", True)
    out["phases"]["beside"] = s.phase(seconds)
    s.set_timeslice("loop", 1)
    s.set_timeslice("trainer", 1)
    try:
        out["phases"]["beside-1us"] = s.phase(seconds)
    finally:
        s.set_timeslice("loop", None)
        s.set_timeslice("trainer", None)
    s.set_open("trainer", False)
    try:
        out["closes"] = {
            "loop": s.closes("loop", closes, 0.15),
            "idle": s.closes("idle", closes, 0.05),
        }
    finally:
        s.set_open("trainer", True)
    return out


def _summary(result: dict[str, Any]) -> str:
    lines = ["| phase | workload | all | WFI | CTA | CILP |", "|---|---|---|---|---|---|"]
    for phase, by_name in result["phases"].items():
        for name, d in by_name.items():
            kinds = " | ".join(str(d[k]) for k in ("all", "wfi", "cta", "cilp"))
            lines.append(f"| {phase} | {name} | {kinds} |")
    for name, per_close in result["closes"].items():
        kinds = {k: sum(d[k] for d in per_close) for k in ("all", "wfi", "cta", "cilp")}
        lines.append(
            f"| {len(per_close)} closes | {name} | {kinds['all']} | {kinds['wfi']} | "
            f"{kinds['cta']} | {kinds['cilp']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    parser.add_argument("--closes", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import _ProbeHandles, driver_version
    from qpolicy.enforcers.rm.files import BorrowedFiles
    from qpolicy.telemetry.probe import NvProbe
    from qpolicy.telemetry.probesource import ProbeSource

    source = ProbeSource(NvProbe().start())
    files = BorrowedFiles()
    lab = Lab(args.gpu, _ProbeHandles(source), files)
    workloads = {
        "loop": Workload(workload_argv("trainer", "--n", "32768", "--sync-every", "1"), lab.env),
        "trainer": Workload(workload_argv("trainer", "--n", "8192"), lab.env),
        # Ready, then waiting on stdin for a go that never comes: a context with nothing to run.
        "idle": Workload(workload_argv("trainer", "--n", "4096", "--wait"), lab.env),
    }
    try:
        for workload in workloads.values():
            workload.wait_ready(120)
        groups = {name: lab.groups(w) for name, w in workloads.items()}
        result = measure(Saves(lab, groups), args.seconds, args.closes)
        result.update(
            driver=driver_version(),
            groups={
                name: [{"tsgs": list(g.tsgs), "compute_tsgs": list(g.compute_tsgs)} for g in gs]
                for name, gs in groups.items()
            },
            done={name: len(w.samples) for name, w in workloads.items() if name != "idle"},
        )
    finally:
        for workload in workloads.values():
            workload.stop()
        files.close_all()
        source.close()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
