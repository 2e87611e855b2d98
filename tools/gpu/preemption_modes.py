"""Where a context's compute preemption mode is set and read: one compute channel, or the TSG.

qgpu.ko sets CTA on an offline context through one compute channel of its TSG (kmod/qgpu/
timeslice.c), where the rm enforcer sets every compute channel (the doctor's lever) and libcuda
names the TSG's handle. nvmock keeps one mode per context whichever handle names it (kmod/nvmock/
control.c) and answers GR_GET_CTXSW_MODES for a TSG's handle too; neither was measured. This
measures it on a GPU, for an 8192 trainer running beside a loop of 0.1 s matmuls (each at its own
timeslice, so that the trainer is switched out and saved, tools/gpu/ctxsw_saves.py):

- ``start``: GR_GET_CTXSW_MODES on each of the trainer's compute channels, on its compute TSG's
  handle and on one of its other TSGs; then a phase, the trainer's saves by kind;
- ``cta-one-channel``: CTA set on the first compute channel alone, then the reads and a phase;
- ``cilp-one-channel``: CILP set back on it, the same;
- ``cta-tsg``: CTA set on the compute TSG's handle, the same;
- ``cilp-tsg``: CILP set back on the TSG's handle, the same.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 -m tools.gpu.preemption_modes --gpu 0 --out preemption-modes.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from qpolicy.doctor.lab import Lab, Workload, workload_argv
from qpolicy.nvrm import abi
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu.ctxsw_saves import delta, saves


def reads(lab: Lab, group: ClientChannels) -> dict[str, Any]:
    """GR_GET_CTXSW_MODES on every compute channel, the compute TSGs and the other TSGs."""
    assert group.subdevice is not None
    targets = [f"channel {c:#x}" for c, _ in group.compute_channels]
    handles = [c for c, _ in group.compute_channels]
    others = [t for t in group.tsgs if t not in group.compute_tsgs][:1]
    for tsg in (*group.compute_tsgs, *others):
        computing = "compute " if tsg in group.compute_tsgs else ""
        targets.append(f"{computing}TSG {tsg:#x}")
        handles.append(tsg)
    out = {}
    for target, handle in zip(targets, handles, strict=True):
        call = lab.control(
            group, target, group.subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, hChannel=handle
        )
        mode = call.answer.get("cilpPreemptMode") if call.status == 0 else None
        out[target] = {
            "status": call.status,
            "mode": None if mode is None else abi.PREEMPTION_MODE_COMPUTE.get(mode, str(mode)),
        }
    return out


def set_mode(lab: Lab, group: ClientChannels, handle: int, mode: int) -> dict[str, Any]:
    assert group.subdevice is not None
    call = lab.control(
        group,
        f"{handle:#x}",
        group.subdevice,
        abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
        flags=abi.PREEMPTION_MODE_FLAG_CILP,
        hChannel=handle,
        cilpPreemptMode=mode,
    )
    return {"handle": handle, "mode": abi.PREEMPTION_MODE_COMPUTE[mode], "status": call.status}


def step(lab: Lab, groups: list[ClientChannels], seconds: float) -> dict[str, Any]:
    before = saves(lab, groups)
    time.sleep(seconds)
    return {"reads": [reads(lab, g) for g in groups], "saves": delta(before, saves(lab, groups))}


def measure(lab: Lab, groups: list[ClientChannels], seconds: float) -> dict[str, Any]:
    group = next(g for g in groups if g.compute_channels and g.compute_tsgs)
    channel = group.compute_channels[0][0]
    tsg = group.compute_tsgs[0]
    cta, cilp = abi.PREEMPTION_MODE_CTA, abi.PREEMPTION_MODE_CILP
    steps: dict[str, Any] = {"start": step(lab, groups, seconds)}
    for name, handle, mode in (
        ("cta-one-channel", channel, cta),
        ("cilp-one-channel", channel, cilp),
        ("cta-tsg", tsg, cta),
        ("cilp-tsg", tsg, cilp),
    ):
        sent = set_mode(lab, group, handle, mode)
        steps[name] = {"set": sent, **step(lab, groups, seconds)}
    return {
        "compute_channels": [c for c, _ in group.compute_channels],
        "compute_tsg": tsg,
        "steps": steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import _ProbeHandles, driver_version
    from qpolicy.enforcers.rm.files import BorrowedFiles
    from qpolicy.telemetry.probe import NvProbe
    from qpolicy.telemetry.probesource import ProbeSource

    source = ProbeSource(NvProbe().start())
    files = BorrowedFiles()
    lab = Lab(args.gpu, _ProbeHandles(source), files)
    trainer = Workload(workload_argv("trainer", "--n", "8192"), lab.env)
    loop = Workload(workload_argv("trainer", "--n", "32768", "--sync-every", "1"), lab.env)
    try:
        for workload in (trainer, loop):
            workload.wait_ready(120)
        result = measure(lab, lab.groups(trainer), args.seconds)
        result["driver"] = driver_version()
    finally:
        for workload in (trainer, loop):
            workload.stop()
        files.close_all()
        source.close()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, s in result["steps"].items():
        modes = {t: r["mode"] or hex(r["status"]) for g in s["reads"] for t, r in g.items()}
        print(name, s.get("set", ""), s["saves"], modes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
