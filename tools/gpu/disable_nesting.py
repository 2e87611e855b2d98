"""Whether FIFO_DISABLE_CHANNELS closes nest on a GPU: does a channel closed twice need two opens?

ctrl2080fifo.h says a disabled channel "will not run until a call with bDisable=NV_FALSE is
made"; what GSP keeps per channel is closed. In call 21B (tools/gpu/sched_only.py, an H200) a
trainer closed twice and opened once never ran again, while one closed once and opened once
always did. Measured here on one 8192 trainer alone on the GPU (the doctor's workload, a
synchronise after every matmul): a fixed sequence of closes and opens (full closes unless named
sched-only), and after each step the matmuls it finished from ``--grace-ms`` to ``--watch-ms``
later. A channel that runs finishes a few hundred; a stopped one none.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/disable_nesting.py --gpu 0 --out disable-nesting.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.doctor.lab import Lab, Workload, workload_argv
from tools.gpu.sched_only import Rig, finished

# (what the step is, the calls it makes). The trainer starts open; the sequence ends open
# whichever way the GPU counts (three opens more than closes at most).
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("open, nothing sent", ()),
    ("closed once", ("close",)),
    ("opened once", ("open",)),
    ("closed twice", ("close", "close")),
    ("then opened once", ("open",)),
    ("then opened again", ("open",)),
    ("opened a third time, while open", ("open",)),
    ("then closed once", ("close",)),
    ("then opened once", ("open",)),
    ("closed sched-only, then closed", ("sched-only", "close")),
    ("then opened once", ("open",)),
    ("then opened again", ("open",)),
    ("closed sched-only twice", ("sched-only", "sched-only")),
    ("then opened once", ("open",)),
    ("then opened again", ("open",)),
)

# ``--steps stall``, with kernels queued behind the running one (``--sync-every 4``): in call
# 21E a trainer closed sched-only so ran nothing after it was opened again, close after close,
# until a SET_TIMESLICE on its TSG. What else wakes it? (The trainer starts open.)
STALL_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("open, nothing sent", ()),
    ("closed sched-only, opened", ("sched-only", "open")),
    ("opened again", ("open",)),
    ("closed and opened", ("close", "open")),
    ("closed sched-only, opened", ("sched-only", "open")),
    ("its timeslice set to what it is", ("timeslice",)),
    ("closed sched-only, opened", ("sched-only", "open")),
    ("nothing sent, a second later", ("wait",)),
    ("closed and opened", ("close", "open")),
    ("closed, opened", ("close", "open")),
)


def run_steps(
    rig: Rig,
    name: str,
    workload: Workload,
    grace_s: float,
    watch_s: float,
    steps: tuple[tuple[str, tuple[str, ...]], ...] = STEPS,
) -> list[dict[str, Any]]:
    out = []
    for what, calls in steps:
        sent = []
        for call in calls:
            if call == "wait":
                rig.sleep(1.0)
                continue
            if call == "timeslice":
                started = rig.clock()
                rig.set_timeslice(name, None)
                sent.append({"call": call, "us": round((rig.clock() - started) * 1e6, 1)})
                continue
            control = rig.set_open(name, call == "open", only_scheduling=call == "sched-only")
            sent.append({"call": call, "us": round(control.us, 1)})
        done_at = rig.clock()
        rig.sleep(grace_s + watch_s)
        out.append(
            {
                "step": what,
                "calls": sent,
                "done": finished(workload.samples, done_at + grace_s, done_at + grace_s + watch_s),
            }
        )
    return out


def summary(steps: list[dict[str, Any]], watch_ms: float) -> str:
    lines = [f"| step | calls | matmuls in {watch_ms:.0f} ms after |", "|---|---|---|"]
    for step in steps:
        calls = ", ".join(c["call"] for c in step["calls"]) or "-"
        lines.append(f"| {step['step']} | {calls} | {step['done']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--grace-ms", type=float, default=20.0)
    parser.add_argument("--watch-ms", type=float, default=300.0)
    parser.add_argument("--steps", choices=("nesting", "stall"), default="nesting")
    parser.add_argument("--sync-every", type=int, default=1, help="matmuls queued per wait")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import _ProbeHandles, driver_version
    from qpolicy.enforcers.rm.files import BorrowedFiles
    from qpolicy.telemetry.probe import NvProbe
    from qpolicy.telemetry.probesource import ProbeSource

    source = ProbeSource(NvProbe().start())
    files = BorrowedFiles()
    lab = Lab(args.gpu, _ProbeHandles(source), files)
    argv = workload_argv("trainer", "--n", "8192", "--sync-every", str(args.sync_every))
    trainer = Workload(argv, lab.env)
    try:
        trainer.wait_ready(120)
        rig = Rig(lab, {"trainer": lab.groups(trainer)})
        chosen = STEPS if args.steps == "nesting" else STALL_STEPS
        steps = run_steps(
            rig, "trainer", trainer, args.grace_ms / 1000, args.watch_ms / 1000, chosen
        )
        result = {"driver": driver_version(), "args": vars(args), "steps": steps}
    finally:
        trainer.stop()
        files.close_all()
        source.close()
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(summary(steps, args.watch_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
