"""How long each RM control that qgpu.ko and the rm enforcer send takes, on a GPU idle and busy,
and whether one client's control waits for another's.

nvmock makes the GSP controls among them take their time (kmod/nvmock/control.c). Before this
tool their times came from the doctor's cost per lever (a mean over its calls, on a busy GPU),
and GR_GET_CTXSW_MODES's was not measured. This measures each control alone, many times, on the
compute context of

- ``idle``: a process whose CUDA context is made and warm and then waits (nothing on the GPU);
- ``busy``: an 8192 bf16 matmul trainer running alone.

Each control leaves the context as it found it: SET_TIMESLICE sends the value GET_TIMESLICE
read, GR_SET_CTXSW_PREEMPTION_MODE the mode GR_GET_CTXSW_MODES read, FIFO_DISABLE_CHANNELS's
disable is followed by its enable. RM's NULL control (0x0, answered by the host before any
lookup, _rmapiRmControl in 580.142) gives the cost of the ioctl itself. Times are the ioctl's
wall time in this process (qpolicy.nvrm.rmctl), in µs.

``queue``: two idle processes, A and B. For each pair, B's control is timed alone and then while
a thread sends A's controls back to back, on A's own client. RM sends a GSP control holding the
GPU's lock (rpcRmApiControl_GSP, src/nvidia/src/kernel/vgpu/rpc.c), and SET_TIMESLICE holds the
API lock for writing besides: read from the source, B should wait behind A. This measures it.

The workloads' objects are found by asking RM handle by handle (qpolicy.nvrm.discover, as the rm
enforcer finds a process its probe never saw), so the tool needs no bcc. As root on a GPU machine
with PyTorch:

    python3 -m tools.gpu.control_times --gpu 0 --out control-times.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qpolicy.doctor.lab import Call, Workload, workload_argv
from qpolicy.doctor.report import percentile
from qpolicy.nvrm import abi, discover, rmctl
from qpolicy.nvrm.tracker import ClientChannels, Tracker
from tools.gpu.discover_check import search


class FoundHandles:
    """The workloads' objects, found by asking RM (the Lab's handles, without the probe)."""

    def __init__(self) -> None:
        self.tracker = Tracker()
        # The newest client before any workload: the searches go down to it, no further.
        self.mark = rmctl.newest_client_handle()

    def find(self, pid: int) -> None:
        made = rmctl.newest_client_handle()
        newest = None if made is None else discover.client_before(made)
        found, _, _ = search(pid, newest, self.mark)
        self.tracker.adopt(discover.process_state(pid, None, found.fds, found.found))

    def refresh(self) -> None:
        """Nothing to read: find() adds what it found."""


class Sends(Protocol):
    """What of the doctor's Lab this tool uses: a control on a group's object, and RM's NULL."""

    def control(
        self, group: ClientChannels, target: str, obj: int, cmd: int, **fields: int
    ) -> Call: ...

    def null(self, group: ClientChannels) -> tuple[int, float]: ...


@dataclass(frozen=True, slots=True)
class Control:
    """One control to time: ``cmd`` (0: RM's NULL) on ``obj`` with ``fields``."""

    name: str
    obj: int
    cmd: int
    fields: dict[str, int] = field(default_factory=dict)

    def send(self, lab: Sends, group: ClientChannels) -> tuple[int, float]:
        if self.cmd == 0:
            return lab.null(group)
        call = lab.control(group, self.name, self.obj, self.cmd, **self.fields)
        return call.status, call.us


def summary(times: Sequence[float]) -> dict[str, float]:
    out: dict[str, float] = {"n": len(times), "max": round(max(times), 1)}
    for q in (50, 90, 99):
        value = percentile(list(times), q / 100)
        assert value is not None
        out[f"p{q}"] = round(value, 1)
    return out


def controls_of(lab: Sends, group: ClientChannels, extra: bool = False) -> dict[str, Control] | str:
    """The controls timed on ``group``'s compute context, each sending back what it read there;
    a line saying why where RM refused the reads. ``extra``: also the controls qgpu.ko only sees
    tenants send (and the doctor's levers), each sent as it leaves the context as it was."""
    assert group.subdevice is not None and group.compute_tsgs and group.compute_channels
    tsg, channel = group.compute_tsgs[0], group.compute_channels[0][0]
    get_ts = lab.control(group, "tsg", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE)
    get_mode = lab.control(
        group, "channel", group.subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, hChannel=channel
    )
    if get_ts.status or get_mode.status:
        return f"reads answered {get_ts.status:#x}, {get_mode.status:#x}"
    channels = group.channels[: abi.FIFO_DISABLE_CHANNELS_MAX]
    sub = group.subdevice
    others = (
        # A preemption of an idle context finds nothing to take off; of the trainer, its kernel.
        Control("PREEMPT", tsg, abi.NVA06C_CTRL_CMD_PREEMPT, {"bWait": 1}),
        # Scheduled already, as CUDA leaves a context once it is made.
        Control("GPFIFO_SCHEDULE", tsg, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, {"bEnable": 1}),
        # MEDIUM: RM's default for a new TSG (kchangrpapiConstruct, kernel_channel_group_api.c).
        Control(
            "SET_INTERLEAVE_LEVEL",
            tsg,
            abi.NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL,
            {"tsgInterleaveLevel": 1},
        ),
        Control("MAKE_REALTIME", tsg, abi.NVA06C_CTRL_CMD_MAKE_REALTIME, {"bRealtime": 0}),
        Control(
            "RESTART_RUNLIST",
            channel,
            abi.NVA06F_CTRL_CMD_RESTART_RUNLIST,
            {"bForceRestart": 0, "bBypassWait": 0},
        ),
    )
    return {
        c.name: c
        for c in (
            Control("NULL", group.client, 0),
            Control("GET_TIMESLICE", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE),
            # What qgpu.ko and the rm enforcer ask a channel RM may have destroyed unseen (qgpu:
            # per TSG and channel of a client after a free that may have): the engine of the
            # object the client's own handle names, which a working channel refuses.
            Control(
                "GET_CLASS_ENGINEID",
                channel,
                abi.NV906F_CTRL_GET_CLASS_ENGINEID,
                {"hObject": group.client},
            ),
            Control(
                "SET_TIMESLICE",
                tsg,
                abi.NVA06C_CTRL_CMD_SET_TIMESLICE,
                {"timesliceUs": get_ts.answer["timesliceUs"]},
            ),
            Control(
                "GR_GET_CTXSW_MODES",
                sub,
                abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES,
                {"hChannel": channel},
            ),
            Control(
                "GR_SET_CTXSW_PREEMPTION_MODE",
                sub,
                abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
                {
                    "flags": abi.PREEMPTION_MODE_FLAG_CILP,
                    "hChannel": channel,
                    "cilpPreemptMode": get_mode.answer["cilpPreemptMode"],
                },
            ),
            # As Lab.saves reads a TSG's saves, and qgpu_rmapi_ctxsw_stats() in qgpu.ko.
            Control(
                "GR_GET_CTXSW_STATS", sub, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS, {"hChannel": tsg}
            ),
            # The enable right after its disable: the context is stopped between the two only.
            Control(
                "FIFO_DISABLE_CHANNELS",
                sub,
                abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                rmctl.disable_channels_fields(group.client, channels, disable=True),
            ),
            Control(
                "FIFO_ENABLE_CHANNELS",
                sub,
                abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
                rmctl.disable_channels_fields(group.client, channels, disable=False),
            ),
            *(others if extra else ()),
        )
    }


def measure(lab: Sends, group: ClientChannels, n: int, extra: bool = False) -> dict[str, Any]:
    """Each control ``n`` times on ``group``'s compute context."""
    controls = controls_of(lab, group, extra)
    if isinstance(controls, str):
        return {"error": controls}
    # Interleaved, so that a slow stretch of the GPU or the host falls on every control alike.
    times: dict[str, list[float]] = {name: [] for name in controls}
    statuses: dict[str, set[int]] = {name: set() for name in controls}
    for _ in range(n):
        for name, control in controls.items():
            status, us = control.send(lab, group)
            times[name].append(us)
            statuses[name].add(status)
    return {
        "timeslice_us": controls["SET_TIMESLICE"].fields["timesliceUs"],
        "mode": abi.PREEMPTION_MODE_COMPUTE.get(
            controls["GR_SET_CTXSW_PREEMPTION_MODE"].fields["cilpPreemptMode"], "?"
        ),
        **{
            name: {"statuses": sorted(f"{s:#x}" for s in statuses[name]), "us": summary(t)}
            for name, t in times.items()
        },
    }


# (A's controls, sent back to back in a thread; B's control, timed). FIFO_DISABLE_CHANNELS is sent
# with its enable, so that A's context is stopped only between the two; B sends the enable alone,
# to channels that are enabled already.
QUEUE_PAIRS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("SET_TIMESLICE",), "GET_TIMESLICE"),
    (("SET_TIMESLICE",), "SET_TIMESLICE"),
    (("SET_TIMESLICE",), "NULL"),
    (("SET_TIMESLICE",), "GR_GET_CTXSW_MODES"),
    (("GR_GET_CTXSW_MODES",), "GET_TIMESLICE"),
    (("GR_GET_CTXSW_MODES",), "GR_GET_CTXSW_MODES"),
    (("GR_SET_CTXSW_PREEMPTION_MODE",), "GET_TIMESLICE"),
    (("GR_SET_CTXSW_PREEMPTION_MODE",), "GR_SET_CTXSW_PREEMPTION_MODE"),
    (("GR_GET_CTXSW_STATS",), "GET_TIMESLICE"),
    (("GR_GET_CTXSW_STATS",), "GR_GET_CTXSW_STATS"),
    (("FIFO_DISABLE_CHANNELS", "FIFO_ENABLE_CHANNELS"), "GET_TIMESLICE"),
    (("FIFO_DISABLE_CHANNELS", "FIFO_ENABLE_CHANNELS"), "FIFO_ENABLE_CHANNELS"),
)


# One call: when it was sent and answered (CLOCK_MONOTONIC, ns, around the whole send), its
# status and the ioctl's own µs.
Span = tuple[int, int, int, float]


def _send_timed(lab: Sends, group: ClientChannels, control: Control, spans: list[Span]) -> None:
    start = time.monotonic_ns()
    status, us = control.send(lab, group)
    spans.append((start, time.monotonic_ns(), status, us))


def _timed(lab: Sends, group: ClientChannels, control: Control, n: int) -> list[Span]:
    spans: list[Span] = []
    for _ in range(n):
        _send_timed(lab, group, control, spans)
    return spans


def _back_to_back(
    lab: Sends,
    group: ClientChannels,
    controls: Sequence[Control],
    started: threading.Event,
    stop: threading.Event,
    spans: list[Span],
) -> None:
    while not stop.is_set():
        for control in controls:
            _send_timed(lab, group, control, spans)
        started.set()


def side_by_side(a: Sequence[Span], b: Sequence[Span]) -> dict[str, Any]:
    """How A's and B's calls fell in B's window: calls answered per second, both together, and
    the gaps between consecutive answers. Where RM runs one control at a time, two controls that
    each take T are answered at most 1/T a second together, and no two answers come closer than
    the later one's own work; where it runs them side by side, both rates add up and answers
    come close."""
    begin, end = b[0][0], b[-1][1]
    answers = sorted([s[1] for s in a if begin <= s[1] <= end] + [s[1] for s in b])
    gaps = [(later - earlier) / 1000 for earlier, later in itertools.pairwise(answers)]
    out: dict[str, Any] = {"calls_per_s": round(len(answers) / ((end - begin) / 1e9), 1)}
    if gaps:
        out["answer_gap_us"] = {
            f"p{q}": round(value, 1)
            for q in (10, 50)
            if (value := percentile(gaps, q / 100)) is not None
        }
    return out


def queue(
    lab: Sends,
    a: ClientChannels,
    b: ClientChannels,
    n: int,
    pairs: Sequence[tuple[Sequence[str], str]] = QUEUE_PAIRS,
    raw: bool = False,
) -> dict[str, Any]:
    """For each pair, B's control ``n`` times alone, then ``n`` times while a thread sends A's
    controls back to back on A's client; A's times beside B too."""
    a_controls, b_controls = controls_of(lab, a), controls_of(lab, b)
    if isinstance(a_controls, str) or isinstance(b_controls, str):
        return {"error": f"A: {a_controls}" if isinstance(a_controls, str) else f"B: {b_controls}"}
    out: dict[str, Any] = {}
    for a_names, b_name in pairs:
        b_control = b_controls[b_name]
        alone = _timed(lab, b, b_control, n)
        started, stop = threading.Event(), threading.Event()
        a_spans: list[Span] = []
        thread = threading.Thread(
            target=_back_to_back,
            args=(lab, a, [a_controls[name] for name in a_names], started, stop, a_spans),
            daemon=True,
        )
        thread.start()
        try:
            # B starts once A has sent its controls once: a thread takes a while to start, and
            # B's host-answered controls would be done before A sent any.
            started.wait(10)
            beside = _timed(lab, b, b_control, n)
        finally:
            stop.set()
            thread.join()
        statuses = {s[2] for s in alone + beside + a_spans}
        result: dict[str, Any] = {
            "statuses": sorted(f"{s:#x}" for s in statuses),
            "b_alone_us": summary([s[3] for s in alone]),
            "b_beside_us": summary([s[3] for s in beside]),
            "a_us": summary([s[3] for s in a_spans]) if a_spans else None,
            **side_by_side(a_spans, beside),
        }
        if raw:
            zero = beside[0][0]
            result["raw"] = {
                name: [[(s[0] - zero) // 1000, (s[1] - zero) // 1000] for s in spans]
                for name, spans in (("a", a_spans), ("b", beside))
            }
        out[f"{'+'.join(a_names)} | {b_name}"] = result
    return out


def _found(lab: Any, handles: FoundHandles, workload: Workload) -> ClientChannels:
    workload.wait_ready(120)
    handles.find(workload.pid)
    return next(g for g in lab.groups(workload) if g.compute_tsgs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--n", type=int, default=300, help="calls of each control per state")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--parts",
        default="idle,busy,queue",
        help="which to run, comma-separated: idle, busy (each control alone), queue",
    )
    parser.add_argument("--raw", action="store_true", help="keep the queue study's every call")
    parser.add_argument(
        "--extra",
        action="store_true",
        help="idle, busy: also PREEMPT, GPFIFO_SCHEDULE, SET_INTERLEAVE_LEVEL, MAKE_REALTIME, "
        "RESTART_RUNLIST",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts or parts - {"idle", "busy", "queue"}:
        parser.error(f"--parts: {args.parts!r} is not a list of idle, busy, queue")

    from qpolicy.doctor.checkup import driver_version
    from qpolicy.doctor.lab import Lab
    from qpolicy.enforcers.rm.files import BorrowedFiles

    class ToolLab(Lab):
        def null(self, group: ClientChannels) -> tuple[int, float]:
            """RM's NULL control on the client: status and µs."""
            assert group.pid is not None and group.fd is not None
            fd = self.files.get(group.pid, group.fd)
            result = rmctl.rm_control(fd, group.client, group.client, 0, bytearray())
            return result.status, result.duration_ns / 1000

    handles = FoundHandles()
    files = BorrowedFiles()
    lab = ToolLab(args.gpu, handles, files)
    result: dict[str, Any] = {"driver": driver_version(), "n": args.n}
    idle = workload_argv("trainer", "--n", "8192", "--wait")
    try:
        for state, argv in (("idle", idle), ("busy", workload_argv("trainer", "--n", "8192"))):
            if state not in parts:
                continue
            workload = Workload(argv, lab.env)
            try:
                result[state] = measure(lab, _found(lab, handles, workload), args.n, args.extra)
            finally:
                workload.stop()
        if "queue" in parts:
            first, second = Workload(idle, lab.env), Workload(idle, lab.env)
            try:
                a, b = _found(lab, handles, first), _found(lab, handles, second)
                result["queue"] = queue(lab, a, b, args.n, raw=args.raw)
            finally:
                first.stop()
                second.stop()
    finally:
        files.close_all()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for state in ("idle", "busy"):
        for name, value in result.get(state, {}).items():
            if isinstance(value, dict) and "us" in value:
                print(state, name, value["statuses"], value["us"])
    for pair, value in result.get("queue", {}).items():
        if isinstance(value, dict):
            print(
                "queue",
                pair,
                value["statuses"],
                "B alone p50",
                value["b_alone_us"]["p50"],
                "beside p50/p90",
                value["b_beside_us"]["p50"],
                value["b_beside_us"]["p90"],
                "calls/s",
                value["calls_per_s"],
                "answer gaps",
                value.get("answer_gap_us"),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
