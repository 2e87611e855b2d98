"""What FIFO_DISABLE_CHANNELS with bOnlyDisableScheduling=1 does on a GPU, beside =0.

By ctrl2080fifo.h (NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS), with bOnlyDisableScheduling the
channels are no longer scheduled but, where running, are not removed from the hardware; what GSP
then does is closed. The rm enforcer closes with 0 (running work taken off the engine before the
call returns): 0.6-1.3 ms a control, and an online request released near a turn switch was slow
14-23 % of the time against under 0.8 % elsewhere (BENCHMARKS.md, twentieth session). Were =1 to
stop a trainer at its next timeslice end (1 µs for offline TSGs) and return sooner, turns could
hand the GPU over for less. Measured with the doctor's workloads (qpolicy/doctor/workload.py),
each synchronised after every matmul (after ``--sync-every`` of them, which leaves kernels queued
behind the running one): two 8192 trainers A and B (1.4 ms kernels), a loop of 32768 matmuls
(~0.1 s kernels), and an online stream (4096 at 150 Hz).

- ``stop``: A alone on the GPU (the others closed), then the loop alone, each closed
  ``--closes`` times with each kind of close, at its own timeslice and at 1 µs. Per close: the
  call's duration, the context saves by kind across the call and in the span after it, its
  matmuls finished from ``--grace-ms`` after the call returned to ``--watch-ms`` later (a
  stopped trainer finishes none) against those of as long before the close, and when the first
  matmul after the call finished (a kernel left to run to its end).
- ``handover``: the loop alone on the GPU, closed with each kind of close and A opened at once
  (both at 1 µs), ``--closes`` times: does the loop stop at the hand-over (its context saved as
  A takes the engine) or run its kernel to the end beside A? Per hand-over: the loop's saves and
  matmuls after, when its next matmul finished, and A's matmuls.
- ``turns`` (the loop closed, the online stream started only now): A and B at 1 µs, the online
  stream at 8192 µs (qpolicy's classes). Phases ``solo`` (A and B closed), ``one`` (A open, B
  closed, no turns), then ``full`` and ``sched-only`` alternating ``--rounds`` times: A and B
  handed the GPU every ``--turn-ms``, the one whose turn ends closed by that kind of close, then
  the other opened. Per phase: the controls' durations, each trainer's matmuls and those it
  finished while closed (from ``--grace-ms`` after its close), the online latencies, and those
  of requests released from 1 ms before a close to 3 ms after it (as tools/gpu/daemon_turns.py
  counts them) against the rest, with the share over 1 ms.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/sched_only.py --gpu 0 --out sched-only.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.tracker import ClientChannels
from tools.gpu.ctxsw_saves import delta, saves, set_timeslices
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
        self._open = dict.fromkeys(groups, True)

    def ensure(self, name: str, is_open: bool) -> None:
        """``name`` open or closed, sending a control only if it is not so already: GSP counts
        closes, and a channel closed twice runs again only after two opens (an H200, call 21C,
        tools/gpu/disable_nesting.py)."""
        if self._open.get(name) != is_open:
            self.set_open(name, is_open)

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
            # Whether RM acted on part of the groups is unknown: the next ensure() sends again.
            self._open.pop(name, None)
            raise RuntimeError(f"FIFO_DISABLE_CHANNELS on {name}: {status:#x}")
        self._open[name] = is_open
        return control

    def saves(self, name: str) -> dict[str, int]:
        return saves(self.lab, self.groups[name])

    def set_timeslice(self, name: str, us: int | None) -> None:
        """``us`` on every TSG of ``name``; None: the value each had before."""
        set_timeslices(self.lab, self.groups[name], self._timeslices, us)

    def timeslices(self, name: str) -> list[int]:
        return [self._timeslices[(g.client, t)] for g in self.groups[name] for t in g.tsgs]


def finished(samples: Sequence[tuple[float, float]], start: float, end: float) -> int:
    """Matmuls a trainer finished in [start, end): its samples are (wall time, done so far), in
    order, one per wait (``--sync-every`` matmuls apart)."""
    total, before = 0.0, 0.0
    for t, done in samples:
        if start <= t < end:
            total += done - before
        before = done
    return int(total)


def stop(
    rig: Rig,
    name: str,
    workload: Workload,
    only_scheduling: bool,
    closes: int,
    grace_s: float,
    watch_s: float,
) -> list[dict[str, Any]]:
    """Close ``name`` (alone on the GPU) ``closes`` times; what each close did."""
    out = []
    for _ in range(closes):
        rig.set_open(name, True)
        rig.sleep(grace_s + watch_s)
        before = rig.saves(name)
        control = rig.set_open(name, False, only_scheduling)
        across = rig.saves(name)
        rig.sleep(grace_s + watch_s)
        after = rig.saves(name)
        out.append(
            {
                "us": round(control.us, 1),
                "saves_across": delta(before, across),
                "saves_after": delta(across, after),
                "done_before": finished(workload.samples, control.t0 - watch_s, control.t0),
                "done_after": finished(
                    workload.samples, control.t1 + grace_s, control.t1 + grace_s + watch_s
                ),
                # When the first matmul after the call returned finished (ms), if it did
                # before the span watched ended: a kernel left to run to its end.
                "next_done_ms": next_done_ms(workload.samples, control.t1),
            }
        )
    rig.set_open(name, True)
    return out


def handover(
    rig: Rig,
    names: tuple[str, str],
    workloads: dict[str, Workload],
    only_scheduling: bool,
    closes: int,
    grace_s: float,
    watch_s: float,
) -> list[dict[str, Any]]:
    """``names[0]`` alone on the GPU closed and ``names[1]`` opened at once, ``closes`` times:
    whether the one closed stops at the hand-over or runs its kernel to the end beside it."""
    old, new = names
    out = []
    for _ in range(closes):
        rig.ensure(new, False)
        rig.ensure(old, True)
        rig.sleep(grace_s + watch_s)
        before = rig.saves(old)
        control = rig.set_open(old, False, only_scheduling)
        opened = rig.set_open(new, True)
        across = rig.saves(old)
        rig.sleep(grace_s + watch_s)
        after = rig.saves(old)
        watched = (opened.t1 + grace_s, opened.t1 + grace_s + watch_s)
        out.append(
            {
                "us": round(control.us, 1),
                "open_us": round(opened.us, 1),
                "saves_across": delta(before, across),
                "saves_after": delta(across, after),
                "done_after": finished(workloads[old].samples, *watched),
                "next_done_ms": next_done_ms(workloads[old].samples, control.t1),
                "new_done": finished(workloads[new].samples, *watched),
            }
        )
    rig.ensure(new, False)
    rig.ensure(old, True)
    return out


def next_done_ms(samples: Sequence[tuple[float, float]], after: float) -> float | None:
    later = [t for t, _ in samples if t >= after]
    return round((min(later) - after) * 1000, 2) if later else None


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
    elif kind == "one":
        # Not both: two TSGs with work at 1 µs switch at every slice and keep ~0.04 % of their
        # throughput (README, measured on an H100); offline pods take exclusive turns.
        controls += [rig.set_open("b", False)]
        rig.sleep(seconds)
        controls += [rig.set_open("b", True)]
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
        spans = closed_spans(controls, name, end, grace_s) if kind in KINDS else []
        out["trainers"][name] = {
            "done": finished(workload.samples, start, end),
            "done_while_closed": sum(finished(workload.samples, a, b) for a, b in spans),
            "closed_s": round(sum(b - a for a, b in spans), 3),
        }
    if kind in KINDS:
        out["online_by_close"] = near_split(requests, closes)
    return out


def measure(
    rig: Rig,
    start_online: Callable[[], Workload],
    workloads: dict[str, Workload],
    *,
    closes: int,
    grace_s: float,
    watch_s: float,
    seconds: float,
    turn_s: float,
    rounds: int,
    stops: Sequence[str] = ("a", "loop"),
    handovers: tuple[str, str] | None = ("loop", "a"),
    turns: bool = True,
) -> dict[str, Any]:
    """``stop`` for each of ``stops`` alone, ``handover`` from one to the other, then (the
    online stream started, the loop closed) the ``turns`` phases of trainers ``a`` and ``b``.
    Leaves every workload open at its own timeslices."""
    out: dict[str, Any] = {"stop": {}, "own_timeslices_us": {}, "handover": {}, "turns": []}
    try:
        for name in stops:
            for other in workloads:
                rig.ensure(other, other == name)
            for timeslice in ("own", "1us"):
                rig.set_timeslice(name, None if timeslice == "own" else GPREEMPT_OFFLINE_US)
                for kind, only in KINDS.items():
                    out["stop"][f"{name} {kind}@{timeslice}"] = stop(
                        rig, name, workloads[name], only, closes, grace_s, watch_s
                    )
            rig.set_timeslice(name, None)
            out["own_timeslices_us"][name] = rig.timeslices(name)
        if handovers:
            for other in workloads:
                if other not in handovers:
                    rig.ensure(other, False)
            rig.set_timeslice(handovers[0], GPREEMPT_OFFLINE_US)
            rig.set_timeslice(handovers[1], GPREEMPT_OFFLINE_US)
            for kind, only in KINDS.items():
                out["handover"][f"{handovers[0]} to {handovers[1]} {kind}"] = handover(
                    rig, handovers, workloads, only, closes, grace_s, watch_s
                )
        if not turns:
            return out
        for name in workloads:
            rig.ensure(name, name in ("a", "b"))
        # Started only now: held while the closes above ran, it would catch up on every slot
        # it missed, back to back (workload.online), into the phases below.
        online = start_online()
        rig.set_timeslice("a", GPREEMPT_OFFLINE_US)
        rig.set_timeslice("b", GPREEMPT_OFFLINE_US)
        rig.set_timeslice("online", ONLINE_TIMESLICE_US)
        kinds = ["solo", "one"]
        for _ in range(rounds):
            kinds += list(KINDS)
        trainers = {"a": workloads["a"], "b": workloads["b"]}
        for kind in kinds:
            out["turns"].append(turns_phase(rig, kind, seconds, turn_s, grace_s, online, trainers))
    finally:
        for name in workloads:
            rig.ensure(name, True)
        for name in rig.groups:
            rig.set_timeslice(name, None)
    return out


def _close_cells(per_close: Sequence[dict[str, Any]]) -> tuple[str, str, str]:
    """A series of closes' median call, CILP saves across / after, and when the next matmul
    finished (median over the closes after which one did)."""
    us = statistics.median(c["us"] for c in per_close)
    cilp = sum(c["saves_across"]["cilp"] for c in per_close)
    cilp_after = sum(c["saves_after"]["cilp"] for c in per_close)
    waits = [c["next_done_ms"] for c in per_close if c["next_done_ms"] is not None]
    wait = f"{statistics.median(waits):.1f}" if waits else "-"
    return f"{us:.0f}", f"{cilp} / {cilp_after}", f"{wait} ({len(waits)} of {len(per_close)})"


def summary(result: dict[str, Any]) -> str:
    lines = [
        "| stop: a close, alone on the GPU | call p50 µs | CILP saves across / after | matmuls in "
        "the span before / after | next matmul done, ms after the call (median, closes with one) |",
        "|---|---|---|---|---|",
    ]
    for name, per_close in result["stop"].items():
        us, saved, wait = _close_cells(per_close)
        before = sum(c["done_before"] for c in per_close)
        after = sum(c["done_after"] for c in per_close)
        lines.append(f"| {name} x{len(per_close)} | {us} | {saved} | {before} / {after} | {wait} |")
    if result.get("handover"):
        lines += [
            "",
            "| hand-over | close p50 µs | CILP saves across / after | closed one's matmuls after "
            "| its next matmul, ms after the close (median, closes with one) | new one's matmuls |",
            "|---|---|---|---|---|---|",
        ]
        for name, per_close in result["handover"].items():
            us, saved, wait = _close_cells(per_close)
            after = sum(c["done_after"] for c in per_close)
            new = sum(c["new_done"] for c in per_close)
            lines.append(
                f"| {name} x{len(per_close)} | {us} | {saved} | {after} | {wait} | {new} |"
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
    parser.add_argument("--no-stop", action="store_true", help="skip the stop closes")
    parser.add_argument("--no-handover", action="store_true", help="skip the hand-overs")
    parser.add_argument("--no-turns", action="store_true", help="skip the turns phases")
    parser.add_argument(
        "--sync-every",
        type=int,
        default=1,
        help="matmuls each workload queues between two waits (more than 1: are those queued "
        "before a sched-only close run?)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import _ProbeHandles, driver_version
    from qpolicy.enforcers.rm.files import BorrowedFiles
    from qpolicy.telemetry.probe import NvProbe
    from qpolicy.telemetry.probesource import ProbeSource

    source = ProbeSource(NvProbe().start())
    files = BorrowedFiles()
    lab = Lab(args.gpu, _ProbeHandles(source), files)
    sizes = {"a": "8192", "b": "8192", "loop": "32768"}
    workloads = {
        name: Workload(
            workload_argv("trainer", "--n", n, "--sync-every", str(args.sync_every)), lab.env
        )
        for name, n in sizes.items()
    }
    try:
        for workload in workloads.values():
            workload.wait_ready(120)
        groups = {name: lab.groups(w) for name, w in workloads.items()}
        rig = Rig(lab, groups)

        def start_online() -> Workload:
            online = lab.start_online(4096, 150.0)
            groups["online"] = lab.groups(online)
            return online

        result = measure(
            rig, start_online, workloads,
            closes=args.closes, grace_s=args.grace_ms / 1000, watch_s=args.watch_ms / 1000,
            seconds=args.seconds, turn_s=args.turn_ms / 1000, rounds=args.rounds,
            stops=() if args.no_stop else ("a", "loop"),
            handovers=None if args.no_handover else ("loop", "a"),
            turns=not args.no_turns,
        )  # fmt: skip
        result.update(
            driver=driver_version(),
            args={k: str(v) for k, v in vars(args).items()},
            sizes=sizes,
            groups={name: [asdict(g) for g in gs] for name, gs in groups.items()},
        )
    finally:
        lab.stop()
        for workload in workloads.values():
            workload.stop()
        files.close_all()
        source.close()
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
