"""How long each RM control that qgpu.ko and the rm enforcer send takes, on a GPU idle and busy.

nvmock makes the GSP controls among them take ``gsp_us`` (kmod/nvmock/control.c). Before this
tool their times came from the doctor's cost per lever (a mean over its calls, on a busy GPU),
and GR_GET_CTXSW_MODES's was not measured. This measures each control alone, many times, on the
compute context of

- ``idle``: a process whose CUDA context is made and warm and then waits (nothing on the GPU);
- ``busy``: an 8192 bf16 matmul trainer running alone.

Each control leaves the context as it found it: SET_TIMESLICE sends the value GET_TIMESLICE
read, GR_SET_CTXSW_PREEMPTION_MODE the mode GR_GET_CTXSW_MODES read. RM's NULL control (0x0,
answered by the host before any lookup, _rmapiRmControl in 580.142) gives the cost of the ioctl
itself. Times are the ioctl's wall time in this process (qpolicy.nvrm.rmctl), in µs.

The workloads' objects are found by asking RM handle by handle (qpolicy.nvrm.discover, as the rm
enforcer finds a process its probe never saw), so the tool needs no bcc. As root on a GPU machine
with PyTorch:

    python3 -m tools.gpu.control_times --gpu 0 --out control-times.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from qpolicy.doctor.lab import Lab, Workload, workload_argv
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


def summary(times: list[float]) -> dict[str, float]:
    out: dict[str, float] = {"n": len(times), "max": round(max(times), 1)}
    for q in (50, 90, 99):
        value = percentile(times, q / 100)
        assert value is not None
        out[f"p{q}"] = round(value, 1)
    return out


def null_control(lab: Lab, group: ClientChannels) -> tuple[int, float]:
    """RM's NULL control on the client: status and µs."""
    assert group.pid is not None and group.fd is not None
    fd = lab.files.get(group.pid, group.fd)
    result = rmctl.rm_control(fd, group.client, group.client, 0, bytearray())
    return result.status, result.duration_ns / 1000


def measure(lab: Lab, group: ClientChannels, n: int) -> dict[str, Any]:
    """Each control ``n`` times on ``group``'s compute context."""
    assert group.subdevice is not None and group.compute_tsgs and group.compute_channels
    tsg, channel = group.compute_tsgs[0], group.compute_channels[0][0]
    get_ts = lab.control(group, "tsg", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE)
    get_mode = lab.control(
        group, "channel", group.subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, hChannel=channel
    )
    if get_ts.status or get_mode.status:
        return {"error": f"reads answered {get_ts.status:#x}, {get_mode.status:#x}"}
    own_ts, own_mode = get_ts.answer["timesliceUs"], get_mode.answer["cilpPreemptMode"]
    controls: list[tuple[str, int, int, dict[str, int]]] = [
        ("NULL", group.client, 0, {}),
        ("GET_TIMESLICE", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, {}),
        ("SET_TIMESLICE", tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, {"timesliceUs": own_ts}),
        (
            "GR_GET_CTXSW_MODES",
            group.subdevice,
            abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES,
            {"hChannel": channel},
        ),
        (
            "GR_SET_CTXSW_PREEMPTION_MODE",
            group.subdevice,
            abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE,
            {
                "flags": abi.PREEMPTION_MODE_FLAG_CILP,
                "hChannel": channel,
                "cilpPreemptMode": own_mode,
            },
        ),
    ]
    out: dict[str, Any] = {
        "timeslice_us": own_ts,
        "mode": abi.PREEMPTION_MODE_COMPUTE.get(own_mode, str(own_mode)),
    }
    # Interleaved, so that a slow stretch of the GPU or the host falls on every control alike.
    times: dict[str, list[float]] = {name: [] for name, *_ in controls}
    statuses: dict[str, set[int]] = {name: set() for name, *_ in controls}
    for _ in range(n):
        for name, obj, cmd, fields in controls:
            if name == "NULL":
                status, us = null_control(lab, group)
            else:
                call = lab.control(group, name, obj, cmd, **fields)
                status, us = call.status, call.us
            times[name].append(us)
            statuses[name].add(status)
    for name, *_ in controls:
        out[name] = {
            "statuses": sorted(f"{s:#x}" for s in statuses[name]),
            "us": summary(times[name]),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--n", type=int, default=300, help="calls of each control per state")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import driver_version
    from qpolicy.enforcers.rm.files import BorrowedFiles

    handles = FoundHandles()
    files = BorrowedFiles()
    lab = Lab(args.gpu, handles, files)
    result: dict[str, Any] = {"driver": driver_version(), "n": args.n}
    try:
        for state, argv in (
            ("idle", workload_argv("trainer", "--n", "8192", "--wait")),
            ("busy", workload_argv("trainer", "--n", "8192")),
        ):
            workload = Workload(argv, lab.env)
            try:
                workload.wait_ready(120)
                handles.find(workload.pid)
                group = next(g for g in lab.groups(workload) if g.compute_tsgs)
                result[state] = measure(lab, group, args.n)
            finally:
                workload.stop()
    finally:
        files.close_all()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for state in ("idle", "busy"):
        for name, value in result.get(state, {}).items():
            if isinstance(value, dict) and "us" in value:
                print(state, name, value["statuses"], value["us"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
