"""Whether qpolicy.nvrm.discover finds, by asking RM, the objects the probe would have seen.

A process that allocated its GPU objects while no daemon ran is invisible to the probe. The
search asks RM about every client handle through the process's own ``/dev/nvidiactl``, then
about the object handles around the client's first device (qpolicy/nvrm/discover.py). Here, on a
real GPU:

1. two processes start under the probe, whose tracker is the reference: an 8192 trainer (the
   doctor's), and a *churner* that first allocates and frees ``--churn`` buffers of
   ``--churn-mib`` one by one with PyTorch's caching allocator off (a long run of freed handles:
   what lies past it is not found), then trains;
2. the probe is closed and a third trainer starts, never seen;
3. each process is searched as the daemon searches: the client handles made since the first
   step (the mark a daemon that ran then would have left), newest first; the reference's
   clients, TSGs and channels are compared with what was found (handles, classes, parents);
4. the unseen trainer is closed and opened with ``FIFO_DISABLE_CHANNELS`` on the found handles
   (matmuls it finishes after each), and its compute TSG's timeslice set and read back;
5. with ``--full-scan``, all 2^20 client handles are asked through one descriptor: the cost per
   control, and what the trainer beside it lost meanwhile. Each handle that names no client
   writes a line to the kernel log (call 23H): not on a machine whose log matters.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/discover_check.py --gpu 0 --out discover.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.doctor.lab import Workload, workload_argv
from qpolicy.nvrm import abi, discover, rmctl
from qpolicy.nvrm.abi import Kind, Node
from qpolicy.nvrm.tracker import ProcessState, Tracker
from tools.gpu.sched_only import finished

CHURNER = """
import json, os, sys, time, torch
n, churn, mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
held = torch.empty(1, device="cuda")
for _ in range(churn):
    x = torch.empty(mib << 18, device="cuda")  # mib MiB, its own cudaMalloc without the cache
    del x
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print(json.dumps({"ready": os.getpid()}), flush=True)
done = 0
while True:
    for _ in range(4):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    done += 4
    print(json.dumps({"t": time.time(), "done": done}), flush=True)
"""


def tree(proc: ProcessState) -> dict[int, dict[int, tuple[int, int | None]]]:
    """client -> handle -> (class, parent), of clients on a known fd."""
    return {
        handle: {o.handle: (o.cls, o.parent) for o in client.objects.values() if not o.dup}
        for handle, client in proc.clients.items()
    }


def compare(
    reference: dict[int, dict[int, tuple[int, int | None]]],
    found: dict[int, dict[int, tuple[int, int | None]]],
) -> dict[str, Any]:
    """Per client of the reference: what the search missed, added or saw otherwise, overall and
    for the objects the rm enforcer uses (device, subdevice, TSG, channel, compute)."""
    used = {Kind.DEVICE, Kind.SUBDEVICE, Kind.TSG, Kind.CHANNEL, Kind.COMPUTE}
    out: dict[str, Any] = {}
    for client, objects in reference.items():
        mine = found.get(client, {})
        missing = sorted(set(objects) - set(mine))
        extra = sorted(set(mine) - set(objects))
        differ = sorted(h for h in set(objects) & set(mine) if objects[h] != mine[h])
        out[f"{client:#x}"] = {
            "reference_objects": len(objects),
            "found_objects": len(mine),
            "missing": len(missing),
            "missing_kinds": dict(Counter(abi.class_kind(objects[h][0]).value for h in missing)),
            "extra": len(extra),
            "differ": [[f"{h:#x}", objects[h], mine[h]] for h in differ[:10]],
            # Of a client with channels (a client without any is searched no further than its
            # device: qpolicy/nvrm/discover.py).
            "enforcer_objects_missing": [
                f"{h:#x}"
                for h in missing
                if abi.class_kind(objects[h][0]) in used
                and any(abi.class_kind(cls) is Kind.CHANNEL for cls, _ in objects.values())
            ],
            "handles": [f"{min(objects):#x}", f"{max(objects):#x}"] if objects else [],
        }
    out["clients_not_found"] = [f"{c:#x}" for c in reference if c not in found]
    out["clients_not_in_reference"] = [f"{c:#x}" for c in found if c not in reference]
    return out


def nvidia_fds(pid: int) -> dict[int, Node]:
    fds: dict[int, Node] = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            fds[int(name)] = Node.of_path(target)
    return fds


def search(
    pid: int, newest: int | None, mark: int | None
) -> tuple[discover.Search, float, float | None]:
    """Search ``pid`` as the daemon does, from ``newest`` down to ``mark`` (the newest client
    made before the workloads started, as a daemon that ran then would have seen it); the
    search, its seconds, and the seconds to its first channels."""
    found = discover.Search(
        pid,
        nvidia_fds(pid),
        newest,
        discover.borrowed_asker,
        oldest=mark,
        refusals=discover.Refusals(1024),
    )
    t0 = time.monotonic()
    first: float | None = None
    while not found.done:
        new = found.step(0.05)
        if first is None and any(c.channels for c in new):
            first = time.monotonic() - t0
    return found, time.monotonic() - t0, first


def levers(pid: int, found: discover.Search, workload: Workload) -> dict[str, Any]:
    """Close and open the found channels; set and read back the compute TSG's timeslice."""
    proc = discover.process_state(pid, None, found.fds, found.found)
    tracker = Tracker()
    tracker.adopt(proc)
    groups = [g for g in tracker.channel_groups(pid) if g.subdevice is not None]
    out: dict[str, Any] = {"groups": len(groups), "steps": []}
    mine = {g.fd: rmctl.borrow_fd(pid, g.fd) for g in groups if g.fd is not None}
    try:
        for label, disable in (("open, nothing sent", None), ("closed", True), ("opened", False)):
            for group in groups:
                if disable is None or group.fd is None or group.subdevice is None:
                    continue
                result = rmctl.disable_channels(
                    mine[group.fd], group.client, group.subdevice, group.channels, disable=disable
                )
                out["steps"].append({"step": label, "status": f"{result.status:#x}"})
            t0 = time.time()
            time.sleep(0.35)
            done = finished(list(workload.samples), t0 + 0.02, t0 + 0.32)
            out["steps"].append({"step": label, "matmuls_20_to_320_ms": done})
        for group in groups:
            for tsg in group.compute_tsgs:
                fd = mine[group.fd] if group.fd is not None else -1
                before = rmctl.get_timeslice(fd, group.client, tsg)
                sent = rmctl.set_timeslice(fd, group.client, tsg, 2000)
                after = rmctl.get_timeslice(fd, group.client, tsg)
                back = rmctl.set_timeslice(fd, group.client, tsg, before[1])
                out.setdefault("timeslice", []).append(
                    {
                        "tsg": f"{tsg:#x}",
                        "before_us": before[1],
                        "set_2000_status": f"{sent.status:#x}",
                        "read_back_us": after[1],
                        "restored_status": f"{back.status:#x}",
                    }
                )
    finally:
        for fd in mine.values():
            os.close(fd)
    return out


def full_client_scan(pid: int, fd: int, beside: Workload) -> dict[str, Any]:
    """Every client handle asked through ``pid``'s ``fd``; the trainer ``beside`` meanwhile."""
    mine = rmctl.borrow_fd(pid, fd)
    ask = rmctl.HandleAsker(mine)
    statuses: Counter[str] = Counter()
    hits = []
    try:
        before_t = time.time()
        time.sleep(2.0)
        t0 = time.time()
        for handle in discover.client_handles(None):
            if ask.info(handle, handle, abi.HANDLE_INFO_INDEX_CLASSID) is not None:
                hits.append(f"{handle:#x}")
            else:
                statuses[f"{ask.status:#x}"] += 1
        t1 = time.time()
    finally:
        os.close(mine)
    samples = list(beside.samples)
    return {
        "asked": ask.asked,
        "seconds": round(t1 - t0, 3),
        "us_per_control": round((t1 - t0) / max(ask.asked, 1) * 1e6, 3),
        "clients_on_fd": hits,
        "refusals": dict(statuses),
        "trainer_matmuls_per_s_before": round(finished(samples, before_t, t0) / (t0 - before_t), 1),
        "trainer_matmuls_per_s_during": round(finished(samples, t0, t1) / max(t1 - t0, 1e-9), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--churn", type=int, default=20000)
    parser.add_argument(
        "--churn-mib",
        type=int,
        default=32,
        help="each churned buffer's size: 1 MiB ones are suballocated by CUDA (no RM object "
        "each: call 23B); larger ones are RM allocations of their own",
    )
    parser.add_argument(
        "--full-scan",
        action="store_true",
        help="ask all 2^20 client handles once (writes ~2^20 lines to the kernel log)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from qpolicy.doctor.checkup import _ProbeHandles, driver_version
    from qpolicy.telemetry.probe import NvProbe
    from qpolicy.telemetry.probesource import ProbeSource

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.gpu)}
    result: dict[str, Any] = {"driver": driver_version(), "args": vars(args)}
    mark = rmctl.newest_client_handle()
    result["newest_client_at_start"] = f"{mark or 0:#x}"
    source = ProbeSource(NvProbe().start())
    handles = _ProbeHandles(source)
    workloads: dict[str, Workload] = {}
    try:
        workloads["trainer"] = Workload(workload_argv("trainer", "--n", "8192"), env)
        churn_env = {**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        argv = [sys.executable, "-c", CHURNER, "8192", str(args.churn), str(args.churn_mib)]
        workloads["churner"] = Workload(argv, churn_env)
        for workload in workloads.values():
            workload.wait_ready(300)
        time.sleep(0.5)
        handles.refresh()
        reference = {
            name: tree(handles.tracker.processes[w.pid])
            for name, w in workloads.items()
            if w.pid in handles.tracker.processes
        }
        source.close()
        workloads["unseen"] = Workload(workload_argv("trainer", "--n", "8192"), env)
        workloads["unseen"].wait_ready(300)
        made = rmctl.newest_client_handle()
        # Freed again with its file: the search starts just below it, as the daemon's does.
        newest = None if made is None else discover.client_before(made)
        result["newest_client"] = f"{made or 0:#x}"
        for name, workload in workloads.items():
            found, seconds, first = search(workload.pid, newest, mark)
            entry: dict[str, Any] = {
                "pid": workload.pid,
                "fds": {str(fd): node.value for fd, node in found.fds.items()},
                "asked": found.asked,
                "seconds": round(seconds, 3),
                "seconds_to_channels": None if first is None else round(first, 3),
                "error": found.error,
                "clients": [
                    {
                        "handle": f"{c.handle:#x}",
                        "fd": c.fd,
                        "objects": len(c.objects),
                        "channels": c.channels,
                    }
                    for c in found.found
                ],
            }
            mine = {c.handle: dict(c.objects) for c in found.found}
            if name in reference:
                entry["against_probe"] = compare(reference[name], mine)
            result[name] = entry
            if name == "unseen":
                result["levers_on_unseen"] = levers(workload.pid, found, workload)
        if args.full_scan:
            unseen = workloads["unseen"].pid
            ctl = [fd for fd, node in nvidia_fds(unseen).items() if node is Node.CTL]
            result["full_client_scan"] = full_client_scan(unseen, ctl[0], workloads["trainer"])
    finally:
        for workload in workloads.values():
            workload.stop()
        source.close()
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    summary = {k: v for k, v in result.items() if k in ("newest_client", "full_client_scan")}
    for name in ("trainer", "churner", "unseen"):
        if name in result:
            r = result[name]
            summary[name] = {
                k: r.get(k) for k in ("asked", "seconds", "seconds_to_channels", "error", "clients")
            }
            if "against_probe" in r:
                summary[name]["against_probe"] = r["against_probe"]
    summary["levers_on_unseen"] = result.get("levers_on_unseen")
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
