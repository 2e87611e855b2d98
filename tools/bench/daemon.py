"""Daemon CPU without a GPU: the rm enforcer's loop for N busy pods at a 50 ms period.

The daemon runs for real (its loop thread, control worker, state file, cgroup tree, tracker and
slice scheduler); only the eBPF probe is replaced by a feed of RM allocations and ever-growing
launch counters, and the RM controls by calls that return at once. What it measures is the
daemon's own work; on a GPU machine each RM control adds about a millisecond of kernel time
(`make bench-gpu` measures that total). Target: < 2 % of one core with 10 pods; the comparison is
the same daemon with turns as short as the period makes them (--min-turn-ms 0).
"""

from __future__ import annotations

import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from qpolicy.backends.base import BackendContext
from qpolicy.backends.rm import RmBackend
from qpolicy.daemon import Daemon, DaemonConfig, ProbeMode
from qpolicy.enforcers.rm import record
from qpolicy.model import PodSpec
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.abi import NvStatus
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.devices import DeviceFilter, Node
from qpolicy.telemetry.probe import CgroupCounters
from qpolicy.telemetry.probesource import ProbeSource
from qpolicy.telemetry.wire import ProbeRecord

TARGET_PERCENT = 2.0
RM_ALLOC = 0xC030462B
CLIENT = 0xC1D00001


def _alloc(
    pid: int, cgroup: int, handle: int, parent: int, cls: int, inner: bytes = b""
) -> ProbeRecord:
    arg = abi.NVOS64.pack(
        hRoot=handle if cls == 0x41 else CLIENT,
        hObjectParent=parent,
        hObjectNew=handle,
        hClass=cls,
        pAllocParms=0x1000 if inner else 0,
        status=0,
    )
    return ProbeRecord(
        "ioctl", ts=1, tid=pid, cmd=RM_ALLOC, a1=5, a2=0x10, a3=0, ret=0, p=arg, q=inner,
        pid=pid, cgroup=cgroup, major=195, minor=0,
    )  # fmt: skip


def _process(pid: int, cgroup: int) -> list[ProbeRecord]:
    """What a PyTorch process allocates that the enforcer acts on (docs/gpu-measurements.md)."""
    records = [
        ProbeRecord("open", ts=0, tid=pid, ret=5, s="/dev/nvidia0", pid=pid, cgroup=cgroup,
                    major=195, minor=0),
        _alloc(pid, cgroup, CLIENT, 0, 0x41),
        _alloc(pid, cgroup, 0xD0, CLIENT, 0x80, abi.NV0080_ALLOC_PARAMETERS.pack(deviceId=0)),
        _alloc(pid, cgroup, 0xD1, 0xD0, 0x2080),
    ]  # fmt: skip
    for t in range(4):
        records.append(_alloc(pid, cgroup, 0x100 + t, 0xD0, 0xA06C))
        records += [_alloc(pid, cgroup, 0x200 + 16 * t + c, 0x100 + t, 0xC86F) for c in range(5)]
    return records


class _BusyProbe:
    """Every pod launches all the time."""

    def __init__(self, cgroups: list[int], pids: list[int]) -> None:
        self.devices = DeviceFilter.nvidia("")
        self.lost = 0
        self.pending = [r for pid, cg in zip(pids, cgroups, strict=True) for r in _process(pid, cg)]
        self._cgroups = cgroups
        self._launches = 0

    def poll(self, timeout_ms: int = 0) -> list[ProbeRecord]:
        out, self.pending = self.pending, []
        return out

    def counters(self) -> dict[int, CgroupCounters]:
        return {cg: CgroupCounters(cg, launches=self._launches) for cg in self._cgroups}

    def launches(self) -> dict[int, int]:
        self._launches += 1
        return dict.fromkeys(self._cgroups, self._launches)

    def node_of(self, major: int, minor: int) -> Node:
        return self.devices.node_of(major, minor)


def _fake_rm() -> list[int]:
    sent = [0]

    def disable(fd: int, client: int, sub: int, ch: list[int], *, disable: bool) -> Any:
        sent[0] += 1
        return rmctl.ControlResult(NvStatus.NV_OK, 600_000)

    rmctl.disable_channels = disable  # type: ignore[assignment]
    rmctl.get_timeslice = lambda fd, c, t: (rmctl.ControlResult(NvStatus.NV_OK, 1), 2048)  # type: ignore[assignment]
    rmctl.set_timeslice = lambda fd, c, t, us: rmctl.ControlResult(NvStatus.NV_OK, 1)  # type: ignore[assignment]
    rmctl.gpu_pci_address = lambda fd, client, subdevice: None  # type: ignore[assignment]
    record.process_start_time = lambda pid: 1  # type: ignore[assignment]
    return sent


class _Files:
    """Borrowed descriptors without processes behind them: numbers."""

    def get(self, pid: int, fd: int) -> int:
        return 1000 + pid

    def forget(self, pid: int) -> None:
        pass

    def reconcile(self) -> list[int]:
        return []

    def close_all(self) -> None:
        pass

    def __len__(self) -> int:
        return 0


def measure(pods: int, min_turn_ms: float, seconds: float) -> dict[str, float]:
    sent = _fake_rm()
    with tempfile.TemporaryDirectory(prefix="qpolicy-bench-daemon-") as tmp:
        root = Path(tmp) / "cgroup"
        for i in range(pods):
            (root / f"p{i}").mkdir(parents=True)
        cgroups = CgroupMap(root=root)
        ids = [cgroups.id_of(f"/p{i}") for i in range(pods)]
        probe = _BusyProbe(ids, [100 + i for i in range(pods)])
        state_dir = Path(tmp) / "state"
        from qpolicy.state import StateStore

        def add(state: Any) -> Any:
            for i in range(pods):
                state = state.with_pod(PodSpec(f"/p{i}", 0))
            return state

        StateStore(state_dir).update(add)
        config = DaemonConfig(
            state_dir=state_dir, metrics_addr=None, cgroup_root=root, probe=ProbeMode.ON
        )

        def backend(context: BackendContext) -> RmBackend:
            return RmBackend(context, min_turn_ms=min_turn_ms, files=_Files(), gpus=list)  # type: ignore[arg-type]

        agent = Daemon(
            config,
            backend,
            probe_loader=lambda: ProbeSource(probe, cgroups),  # type: ignore[arg-type]
        )
        runner = threading.Thread(target=agent.run)
        runner.start()
        try:
            time.sleep(2.0)  # start-up: first plans, timeslices
            before, controls = resource.getrusage(resource.RUSAGE_SELF), sent[0]
            time.sleep(seconds)
            after = resource.getrusage(resource.RUSAGE_SELF)
            controls = sent[0] - controls
        finally:
            agent.stop()
            runner.join(timeout=10)
    user = 100 * (after.ru_utime - before.ru_utime) / seconds
    system = 100 * (after.ru_stime - before.ru_stime) / seconds
    return {
        "cpu_percent": round(user + system, 2),
        "user_percent": round(user, 2),
        "system_percent": round(system, 2),
        "rm_controls_per_s": round(controls / seconds, 1),
    }


def run(seconds: float = 10.0) -> dict[str, Any]:
    results: dict[str, Any] = {"target_percent": TARGET_PERCENT, "period_ms": 50, "runs": {}}
    for pods in (2, 10):
        for min_turn in (200.0, 0.0):
            label = f"{pods} pods, --min-turn-ms {min_turn:g}"
            results["runs"][label] = measure(pods, min_turn, seconds)
    ten = results["runs"]["10 pods, --min-turn-ms 200"]
    results["meets_target"] = ten["cpu_percent"] < TARGET_PERCENT
    return results
