"""What FIFO_DISABLE_CHANNELS with bOnlyDisableScheduling=1 does on a GPU, beside =0.

By ctrl2080fifo.h (NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS), with bOnlyDisableScheduling the
channels are no longer scheduled but, where running, are not removed from the hardware; what GSP
then does is closed. The rm enforcer closes with 0 (running work taken off the engine before the
call returns): 0.6-1.3 ms a control, and an online request released near a turn switch was slow
14-23 % of the time against under 0.8 % elsewhere (BENCHMARKS.md, twentieth session). Were =1 to
stop a trainer at its next timeslice end (1 µs for offline TSGs) and return sooner, turns could
hand the GPU over for less. Measured with the doctor's workloads (qpolicy/doctor/workload.py):
two 8192 trainers A and B, each synchronised after every matmul, and an online stream (4096 at
150 Hz).

- ``stop``: the online stream held and B closed, A alone on the GPU, closed ``--closes`` times
  with each kind of close, at 1 µs and at its own timeslice. Per close: the call's duration, A's
  context saves by kind across the call and in the ``--watch-ms`` after it, and A's matmuls
  finished from ``--grace-ms`` after the call returned to the end of the watch (a stopped
  trainer finishes none), against those of the same span before the close.
- ``turns``: A and B at 1 µs, the online stream at 8192 µs (qpolicy's classes). Phases ``solo``
  (A and B closed), ``open`` (both open, no turns), then ``full`` and ``sched-only`` alternating
  ``--rounds`` times: A and B handed the GPU every ``--turn-ms``, the one whose turn ends closed
  by that kind of close, then the other opened. Per phase: the controls' durations, each
  trainer's matmuls and those it finished while closed (from ``--grace-ms`` after its close), the
  online latencies, and those of requests released from 1 ms before a close to 3 ms after it
  (as tools/gpu/daemon_turns.py counts them) against the rest, with the share over 1 ms.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/sched_only.py --gpu 0 --out sched-only.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.doctor.lab import Lab, Workload, workload_argv
from qpolicy.doctor.report import latency_stats
from qpolicy.enforcers.strategy import GPREEMPT_OFFLINE_US
from qpolicy.engine import ONLINE_TIMESLICE_US
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu.ctxsw_saves import delta, saves
from tools.gpu.daemon_turns import NEAR_AFTER_MS, NEAR_BEFORE_MS

KINDS = {"full": False, "sched-only": True}  # the close's bOnlyDisableScheduling
SLOW_MS = 1.0


@dataclass(frozen=True, slots=True)
class Control:
    """One FIFO_DISABLE_CHANNELS sent: on whom, which way, its wall-clock span and RM's answer."""

    name: str
    close: bool
    only_scheduling: bool
    t0: float
    t1: float
    status: int

    @property
    def us(self) -> float:
        return (self.t1 - self.t0) * 1e6


class Rig:
    """The workloads' groups, and the closes, opens and timeslices this measurement sets."""

    def __init__(
        self,
        lab: Lab,
        groups: dict[str, list[ClientChannels]],
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        disable: Callable[..., rmctl.ControlResult] = rmctl.disable_channels,
    ) -> None:
        self.lab = lab
        self.groups = groups
        self.clock = clock
        self.sleep = sleep
        self._disable = disable
        self._timeslices: dict[tuple[int, int], int] = {}

    def set_open(self, name: str, is_open: bool, only_scheduling: bool = False) -> Control:
        t0 = self.clock()
        status = 0
        for group in self.groups[name]:
            assert group.pid is not None and group.fd is not None and group.subdevice is not None
            fd = self.lab.files.get(group.pid, group.fd)
            result = self._disable(
                fd, group.client, group.subdevice, group.channels,
                disable=not is_open, only_scheduling=only_scheduling and not is_open,
            )  # fmt: skip
            if not result.ok:
                status = int(result.status)
        control = Control(
            name, not is_open, only_scheduling and not is_open, t0, self.clock(), status
        )
        if status:
            raise RuntimeError(f"FIFO_DISABLE_CHANNELS on {name}: {status:#x}")
        return control

    def saves(self, name: str) -> dict[str, int]:
        return saves(self.lab, self.groups[name])

    def set_timeslice(self, name: str, us: int | None) -> None:
        """``us`` on every TSG of ``name``; None: the value each had before."""
        for group in self.groups[name]:
            for tsg in group.tsgs:
                key = (group.client, tsg)
                if key not in self._timeslices:
                    call = self.lab.control(
                        group, f"TSG {tsg:#x}", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE
                    )
                    self._timeslices[key] = call.answer.get("timesliceUs", 0)
                value = self._timeslices[key] if us is None else us
                self.lab.control(
                    group, f"TSG {tsg:#x}", tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE,
                    timesliceUs=value,
                )  # fmt: skip

    def timeslices(self, name: str) -> list[int]:
        return [self._timeslices[(g.client, t)] for g in self.groups[name] for t in g.tsgs]


class Hold:
    """Holds the online stream's next request while set (Lab.before_request blocks on it)."""

    def __init__(self) -> None:
        self._go = threading.Event()
        self._go.set()

    def __call__(self) -> None:
        self._go.wait()

    def hold(self) -> None:
        self._go.clear()

    def release(self) -> None:
        self._go.set()


def finished(samples: Sequence[tuple[float, float]], start: float, end: float) -> int:
    """Matmuls a trainer finished in [start, end): its samples are (wall time, done so far),
    one per synchronised matmul, so each sample in the span is one matmul."""
    return sum(1 for t, _ in samples if start <= t < end)


def stop(
    rig: Rig,
    trainer: Workload,
    only_scheduling: bool,
    closes: int,
    grace_s: float,
    watch_s: float,
) -> list[dict[str, Any]]:
    """Close trainer ``a`` (alone on the GPU) ``closes`` times; what each close did."""
    out = []
    for _ in range(closes):
        rig.set_open("a", True)
        rig.sleep(grace_s + watch_s)
        before = rig.saves("a")
        control = rig.set_open("a", False, only_scheduling)
        across = rig.saves("a")
        rig.sleep(grace_s + watch_s)
        after = rig.saves("a")
        span = watch_s
        out.append(
            {
                "us": round(control.us, 1),
                "saves_across": delta(before, across),
                "saves_after": delta(across, after),
                "done_before": finished(trainer.samples, control.t0 - span, control.t0),
                "done_after": finished(
                    trainer.samples, control.t1 + grace_s, control.t1 + grace_s + span
                ),
            }
        )
    rig.set_open("a", True)
    return out


def hand_overs(rig: Rig, only_scheduling: bool, seconds: float, turn_s: float) -> list[Control]:
    """A open and B closed at the start; every ``turn_s`` the one whose turn ends is closed,
    then the other opened. Ends with A and B open."""
    controls = [rig.set_open("b", False), rig.set_open("a", True)]
    current, other = "a", "b"
    start = rig.clock()
    next_at = start + turn_s
    while next_at < start + seconds:
        rig.sleep(max(0.0, next_at - rig.clock()))
        controls.append(rig.set_open(current, False, only_scheduling))
        controls.append(rig.set_open(other, True))
        current, other = other, current
        next_at += turn_s
    rig.sleep(max(0.0, start + seconds - rig.clock()))
    controls.append(rig.set_open(other, True))
    return controls


def closed_spans(
    controls: Sequence[Control], name: str, end: float, grace_s: float
) -> list[tuple[float, float]]:
    """From ``grace_s`` after each close of ``name`` returned to the start of its next open."""
    spans = []
    closed_at: float | None = None
    for c in controls:
        if c.name != name:
            continue
        if c.close and closed_at is None:
            closed_at = c.t1 + grace_s
        elif not c.close and closed_at is not None:
            spans.append((closed_at, max(closed_at, c.t0)))
            closed_at = None
    if closed_at is not None:
        spans.append((closed_at, max(closed_at, end)))
    return spans


def near_split(
    requests: Sequence[tuple[float, float]], controls: Sequence[Control]
) -> dict[str, dict[str, Any]]:
    """Online requests (release time, latency ms) released from NEAR_AFTER_MS before a close
    to NEAR_BEFORE_MS after it, against the rest; each with its latencies and share over 1 ms."""
    starts = sorted(c.t0 for c in controls if c.close)
    near: list[float] = []
    away: list[float] = []
    for t, ms in requests:
        hit = any(-NEAR_AFTER_MS <= (t - s) * 1000 <= NEAR_BEFORE_MS for s in starts)
        (near if hit else away).append(ms)
    return {
        name: {**latency_stats(values), "over_1ms": sum(1 for v in values if v > SLOW_MS)}
        for name, values in (("near_close", near), ("elsewhere", away))
    }


def control_stats(controls: Sequence[Control], close: bool) -> dict[str, Any]:
    us = sorted(c.us for c in controls if c.close == close)
    if not us:
        return {"n": 0}
    return {
        "n": len(us),
        "p50_us": round(statistics.median(us), 1),
        "p90_us": round(us[int(0.9 * (len(us) - 1))], 1),
        "max_us": round(us[-1], 1),
    }


def turns_phase(
    rig: Rig,
    kind: str,
    seconds: float,
    turn_s: float,
    grace_s: float,
    online: Workload,
    trainers: dict[str, Workload],
) -> dict[str, Any]:
    """One phase of the ``turns`` measurement: ``solo``, ``open`` or a kind of close."""
    start = rig.clock()
    controls: list[Control] = []
    if kind == "solo":
        controls += [rig.set_open("a", False), rig.set_open("b", False)]
        rig.sleep(seconds)
        controls += [rig.set_open("a", True), rig.set_open("b", True)]
    elif kind == "open":
        rig.sleep(seconds)
    else:
        controls = hand_overs(rig, KINDS[kind], seconds, turn_s)
    end = rig.clock()
    requests = online.between(start, end)
    closes = [c for c in controls if c.close]
    out: dict[str, Any] = {
        "kind": kind,
        "seconds": round(end - start, 3),
        "online": latency_stats([ms for _, ms in requests]),
        "closes": control_stats(controls, True),
        "opens": control_stats(controls, False),
        "trainers": {},
    }
    for name, workload in trainers.items():
        spans = [] if kind == "solo" else closed_spans(controls, name, end, grace_s)
        out["trainers"][name] = {
            "done": finished(workload.samples, start, end),
            "done_while_closed": sum(finished(workload.samples, a, b) for a, b in spans),
            "closed_s": round(sum(b - a for a, b in spans), 3),
        }
    if closes and kind != "solo":
        out["online_by_close"] = near_split(requests, closes)
    return out


def measure(
    rig: Rig,
    hold: Hold,
    online: Workload,
    trainers: dict[str, Workload],
    *,
    closes: int,
    grace_s: float,
    watch_s: float,
    seconds: float,
    turn_s: float,
    rounds: int,
    settle_s: float = 5.0,
) -> dict[str, Any]:
    out: dict[str, Any] = {"stop": {}, "turns": []}
    hold.hold()
    try:
        rig.set_open("b", False)
        for timeslice in ("own", "1us"):
            rig.set_timeslice("a", None if timeslice == "own" else GPREEMPT_OFFLINE_US)
            for kind, only in KINDS.items():
                out["stop"][f"{kind}@{timeslice}"] = stop(
                    rig, trainers["a"], only, closes, grace_s, watch_s
                )
        out["own_timeslices_us"] = rig.timeslices("a")
    finally:
        rig.set_open("b", True)
        hold.release()
    # The held stream catches up on the slots it missed, back to back (workload.online): let it
    # before any phase is timed. Its late requests count by their slots, before the phases.
    rig.sleep(settle_s)
    rig.set_timeslice("a", GPREEMPT_OFFLINE_US)
    rig.set_timeslice("b", GPREEMPT_OFFLINE_US)
    rig.set_timeslice("online", ONLINE_TIMESLICE_US)
    try:
        kinds = ["solo", "open"]
        for _ in range(rounds):
            kinds += list(KINDS)
        for kind in kinds:
            out["turns"].append(turns_phase(rig, kind, seconds, turn_s, grace_s, online, trainers))
    finally:
        for name in ("a", "b"):
            rig.set_open(name, True)
        for name in ("a", "b", "online"):
            rig.set_timeslice(name, None)
    return out


def summary(result: dict[str, Any]) -> str:
    lines = [
        "| stop: close of A alone | call p50 µs | CILP saves across / after | A's matmuls in the "
        "span before / after |",
        "|---|---|---|---|",
    ]
    for name, per_close in result["stop"].items():
        us = statistics.median(c["us"] for c in per_close)
        cilp = sum(c["saves_across"]["cilp"] for c in per_close)
        cilp_after = sum(c["saves_after"]["cilp"] for c in per_close)
        before = sum(c["done_before"] for c in per_close)
        after = sum(c["done_after"] for c in per_close)
        lines.append(
            f"| {name} x{len(per_close)} | {us:.0f} | {cilp} / {cilp_after} | {before} / {after} |"
        )
    lines += [
        "",
        "| turns phase | online p50 / p99 / p99.9 ms (n) | close p50 µs | A / B matmuls (while "
        "closed) | near a close: n, over 1 ms | elsewhere: n, over 1 ms |",
        "|---|---|---|---|---|---|",
    ]
    for phase in result["turns"]:
        o = phase["online"]
        t = phase["trainers"]
        split = phase.get("online_by_close", {})
        near = split.get("near_close", {})
        away = split.get("elsewhere", {})
        lines.append(
            f"| {phase['kind']} | {o['p50_ms']} / {o['p99_ms']} / {o['p999_ms']} ({o['requests']}) "
            f"| {phase['closes'].get('p50_us', '-')} "
            f"| {t['a']['done']} ({t['a']['done_while_closed']}) / {t['b']['done']} "
            f"({t['b']['done_while_closed']}) "
            f"| {near.get('requests', '-')}, {near.get('over_1ms', '-')} "
            f"| {away.get('requests', '-')}, {away.get('over_1ms', '-')} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--closes", type=int, default=10, help="closes of each kind in stop")
    parser.add_argument("--grace-ms", type=float, default=20.0)
    parser.add_argument("--watch-ms", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of a turns phase")
    parser.add_argument("--turn-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import _ProbeHandles, driver_version
    from qpolicy.enforcers.rm.files import BorrowedFiles
    from qpolicy.telemetry.probe import NvProbe
    from qpolicy.telemetry.probesource import ProbeSource

    source = ProbeSource(NvProbe().start())
    files = BorrowedFiles()
    lab = Lab(args.gpu, _ProbeHandles(source), files)
    hold = Hold()
    lab.before_request = hold
    trainers = {
        name: Workload(workload_argv("trainer", "--n", "8192", "--sync-every", "1"), lab.env)
        for name in ("a", "b")
    }
    online = lab.start_online(4096, 150.0)
    try:
        for workload in trainers.values():
            workload.wait_ready(120)
        groups = {name: lab.groups(w) for name, w in trainers.items()}
        groups["online"] = lab.groups(online)
        rig = Rig(lab, groups)
        result = measure(
            rig, hold, online, trainers,
            closes=args.closes, grace_s=args.grace_ms / 1000, watch_s=args.watch_ms / 1000,
            seconds=args.seconds, turn_s=args.turn_ms / 1000, rounds=args.rounds,
        )  # fmt: skip
        result.update(
            driver=driver_version(),
            args={k: str(v) for k, v in vars(args).items()},
            groups={name: [asdict(g) for g in gs] for name, gs in groups.items()},
        )
    finally:
        hold.release()
        lab.stop()
        for workload in trainers.values():
            workload.stop()
        files.close_all()
        source.close()
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
