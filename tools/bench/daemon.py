"""Daemon CPU without a GPU: the rm enforcer's loop for N busy pods, before and after 2026-11-25.

The daemon runs for real (its loop thread, control worker, state file, record, cgroup tree, tracker
and slice scheduler); only the eBPF probe is replaced by a feed of RM allocations and ever-growing
launch counters, and the driver by a stand-in at the ioctl boundary (``rmctl._libc.ioctl``): the
controls' parameters are built and packed as for the GPU, and each RM control then spins for
``gsp_us`` of CPU. That is what a control costs the daemon on a GSP GPU: RM busy-polls for the
GSP's answer on the calling thread (src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c:
_kgspRpcRecvPoll, whose wait is osSpinLoop), 0.65-1.5 ms a control (docs/levers.md), so the
target's "GSP control time included" is measured here too (as user time: the spin is Python's).
Each read of the probe's launch counters spins ``map_read_us`` (the bcc batch read, measured by
``make bench probemaps``).

Turns are the daemon's default minimum (400 ms since 2026-11-26); one more row runs the new loop at
200 ms, the default before, in the same run. Target: <= 2 % of one core with 10 busy pods. Side
by side, in the same run: the loop with the sensor polled every 25 ms as before
(``fixed_poll_us``; the other changes of 2026-11-25, no record write per switch and no burst
crumbs, are in both), the loop as it is (a look only when a turn can end or a pod can change),
and the daemon with no enforcer (its probe and publishing alone: the floor); and the same for
``make bench-gpu``'s online rows (an online pod and one trainer, burst-share), where nothing is
gated and the loop has stepped once a second since 2026-12-07 (quiet periods). Shares are checked
in virtual time (tests/unit/test_rm_enforcer.py), not here: a window of wall time cuts a period
anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qpolicy.backends import rm as rm_backend
from qpolicy.backends.base import BackendContext
from qpolicy.backends.observe import ObserveBackend
from qpolicy.backends.rm import DEFAULT_MIN_TURN_MS, RmBackend
from qpolicy.daemon import Daemon, DaemonConfig, ProbeMode
from qpolicy.enforcers.rm import enforcer as rm_enforcer
from qpolicy.enforcers.rm import record
from qpolicy.enforcers.rm.sensor import RmUsageSensor
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.nvrm import abi, rmctl
from qpolicy.runtime.realtime import RealtimeLoop
from qpolicy.state import StateStore
from qpolicy.telemetry.cgroups import CgroupMap
from qpolicy.telemetry.devices import DeviceFilter, Node
from qpolicy.telemetry.probe import CgroupCounters
from qpolicy.telemetry.probesource import ProbeSource
from qpolicy.telemetry.wire import ProbeRecord

TARGET_PERCENT = 2.0
# One single-key read of the launch map (`make bench probemaps`: launches_of_one_us).
MAP_LOOKUP_S = 2e-6
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

    def __init__(self, cgroups: list[int], pids: list[int], map_read_us: float) -> None:
        self.map_read_s = map_read_us / 1e6
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
        _spin(self.map_read_s)
        self._launches += 1
        return dict.fromkeys(self._cgroups, self._launches)

    def launches_of(self, cgroups: list[int]) -> dict[int, int]:
        _spin(MAP_LOOKUP_S * len(cgroups))
        self._launches += 1
        return {cg: self._launches for cg in cgroups if cg in self._cgroups}

    def node_of(self, major: int, minor: int) -> Node:
        return self.devices.node_of(major, minor)


class _FakeLibc:
    """The driver at the ioctl boundary: RM_CONTROL answers NV_OK (the request's status field is
    packed as 0) after spinning for what a GSP round trip costs the caller's CPU."""

    def __init__(self, gsp_us: float) -> None:
        self.gsp_s = gsp_us / 1e6
        self.controls: dict[int, int] = {}

    def ioctl(self, fd: int, request: int, argument: Any) -> int:
        assert request == rmctl.RM_CONTROL_REQUEST
        cmd = abi.NVOS54.unpack(argument.raw)["cmd"]
        self.controls[cmd] = self.controls.get(cmd, 0) + 1
        _spin(self.gsp_s)
        return 0


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _fake_rm(gsp_us: float) -> _FakeLibc:
    libc = _FakeLibc(gsp_us)
    rmctl._libc = libc  # type: ignore[assignment]
    rmctl.gpu_pci_address = lambda fd, client, subdevice: None  # type: ignore[assignment]
    record.process_start_time = lambda pid: 1  # type: ignore[assignment]
    return libc


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


# This file also runs on a tree from before 2026-11-25 (``git archive``), for the comparison in
# BENCHMARKS.md: there the loop has no ``fixed_poll_us`` (it always polled every 25 ms).
FIXED_POLL = "fixed_poll_us" in inspect.signature(rm_enforcer.RmEnforcer).parameters


class _Counts:
    """Sensor polls and loop callbacks, counted at the class (so that methods bound before
    counting started are counted too, on any tree)."""

    def __init__(self) -> None:
        self.polls = 0
        self.partial = 0  # of them, looks that read the holder's counters alone
        self.callbacks = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Counts]:
        poll, call = RmUsageSensor.poll, RealtimeLoop._call

        def counted_poll(sensor: RmUsageSensor, pods: AbstractSet[str] | None = None) -> None:
            self.polls += 1
            self.partial += pods is not None
            poll(sensor, pods)

        def counted_call(loop: RealtimeLoop, callback: Callable[[], None]) -> None:
            self.callbacks += 1
            call(loop, callback)

        with (
            mock.patch.object(RmUsageSensor, "poll", counted_poll),
            mock.patch.object(RealtimeLoop, "_call", counted_call),
        ):
            yield self


class _CountingEvent(threading.Event):
    """The real-time loop's wake-up event, counting its waits: one per wake-up of the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def _enforcer(fixed_poll_us: float | None) -> Callable[..., rm_enforcer.RmEnforcer]:
    if not FIXED_POLL:
        return rm_enforcer.RmEnforcer
    return functools.partial(rm_enforcer.RmEnforcer, fixed_poll_us=fixed_poll_us)


MODES = {
    # label: the rm enforcer's fixed poll (None: none), or no enforcer at all
    "before: 25 ms polls": 25_000.0,
    "after: looks when due": None,
    "probe only (--enforcer none)": "none",
}


def measure(
    pods: int,
    *,
    fixed_poll_us: float | str | None,
    seconds: float,
    gsp_us: float = 1000.0,
    map_read_us: float = 50.0,
    min_turn_ms: float = DEFAULT_MIN_TURN_MS,
    online: bool = False,
    churn_per_s: float = 0.0,
) -> dict[str, float]:
    """The daemon's CPU with ``pods`` busy offline pods under best-effort, or, ``online``, the
    online rows' shape of ``make bench-gpu``: an online pod (share 20) and a trainer (80) under
    burst-share (``pods`` must then be 2). ``churn_per_s``: changes a second to the probe's
    tracker from outside the pods (the GPU hosts' own `nvidia-smi` calls moved it about six
    times a second, BENCHMARKS.md 2026-12-07, fifty-fifth session)."""
    libc = _fake_rm(gsp_us)
    with tempfile.TemporaryDirectory(prefix="qpolicy-bench-daemon-") as tmp:
        root = Path(tmp) / "cgroup"
        for i in range(pods):
            (root / f"p{i}").mkdir(parents=True)
        cgroups = CgroupMap(root=root)
        ids = [cgroups.id_of(f"/p{i}") for i in range(pods)]
        probe = _BusyProbe(ids, [100 + i for i in range(pods)], map_read_us)
        state_dir = Path(tmp) / "state"

        def add(state: Any) -> Any:
            if online:
                state = state.with_gpu(GpuConfig(0, GpuPolicy.BURST_SHARE))
                state = state.with_pod(PodSpec("/p0", 0, PodClass.ONLINE, share=20))
                return state.with_pod(PodSpec("/p1", 0, share=80))
            for i in range(pods):
                state = state.with_pod(PodSpec(f"/p{i}", 0))
            return state

        StateStore(state_dir).update(add)
        config = DaemonConfig(
            state_dir=state_dir, metrics_addr=None, cgroup_root=root, probe=ProbeMode.ON
        )
        enforcer = _enforcer(fixed_poll_us if isinstance(fixed_poll_us, float) else None)
        counts = _Counts()

        def backend(context: BackendContext) -> RmBackend | ObserveBackend:
            if fixed_poll_us == "none":
                return ObserveBackend(context)
            return RmBackend(context, min_turn_ms=min_turn_ms, files=_Files(), gpus=list)  # type: ignore[arg-type]

        agent = Daemon(
            config,
            backend,
            probe_loader=lambda: ProbeSource(probe, cgroups),  # type: ignore[arg-type]
        )
        wake = agent.loop._wake = _CountingEvent()
        with mock.patch.object(rm_backend, "RmEnforcer", enforcer), counts.installed():
            runner = threading.Thread(target=agent.run)
            runner.start()
            stop_churn = threading.Event()
            if churn_per_s:

                def churn() -> None:
                    tracker = agent.probe.view.tracker if agent.probe is not None else None
                    while tracker is not None and not stop_churn.wait(1.0 / churn_per_s):
                        agent.loop.call_soon(lambda: tracker.changed("alloc"))

                threading.Thread(target=churn, daemon=True).start()
            try:
                time.sleep(3.0)  # start-up: first plans, timeslices, the period stretched
                before = resource.getrusage(resource.RUSAGE_SELF)
                controls = sum(libc.controls.values())
                callbacks, polls, waits = counts.callbacks, counts.polls, wake.waits
                partial = counts.partial
                time.sleep(seconds)
                after = resource.getrusage(resource.RUSAGE_SELF)
                controls = sum(libc.controls.values()) - controls
                callbacks = counts.callbacks - callbacks
                polls = counts.polls - polls
                partial = counts.partial - partial
                waits = wake.waits - waits
            finally:
                stop_churn.set()
                agent.stop()
                runner.join(timeout=10)
    user = 100 * (after.ru_utime - before.ru_utime) / seconds
    system = 100 * (after.ru_stime - before.ru_stime) / seconds
    return {
        "cpu_percent": round(user + system, 2),
        "user_percent": round(user, 2),
        "system_percent": round(system, 2),
        "gsp_percent": round(100 * controls * gsp_us / 1e6 / seconds, 2),
        "rm_controls_per_s": round(controls / seconds, 1),
        "loop_wakeups_per_s": round(waits / seconds, 1),
        "loop_callbacks_per_s": round(callbacks / seconds, 1),
        "sensor_polls_per_s": round(polls / seconds, 1),
        "holder_only_polls_per_s": round(partial / seconds, 1),
    }


def virtual(seconds: float = 20.0) -> dict[str, Any]:
    """The loop's wake-ups, polls and controls per second in virtual time, on the unit tests'
    rig (tests/unit/test_rm_enforcer.py: the real enforcer, a fake driver, 0.6 ms controls):
    deterministic, whatever the machine does."""
    import pytest  # the rig's monkeypatching (a development dependency, like the rig)

    from tests.unit import test_rm_enforcer as rig_module

    cases = {
        "10 busy pods, best-effort": (
            [PodSpec(f"/p{i}", 0) for i in range(10)],
            GpuPolicy.BEST_EFFORT,
        ),
        "fixed-share 70/30": (
            [PodSpec("/a", 0, share=70), PodSpec("/b", 0, share=30)],
            GpuPolicy.FIXED_SHARE,
        ),
        "online 20 + trainer 80, burst-share": (
            [PodSpec("/web", 0, PodClass.ONLINE, share=20), PodSpec("/train", 0, share=80)],
            GpuPolicy.BURST_SHARE,
        ),
    }
    modes = {"before: 25 ms polls": 25_000.0, "after: looks when due": None}
    results: dict[str, Any] = {}
    for name, (pods, policy) in cases.items():
        for label, fixed in modes.items():
            counts = _Counts()
            with (
                tempfile.TemporaryDirectory() as tmp,
                pytest.MonkeyPatch.context() as patch,
                mock.patch.object(rig_module, "RmEnforcer", _enforcer(fixed)),
                counts.installed(),
            ):
                r = rig_module.rig(Path(tmp), patch, pods, policy, min_turn_us=200_000)
                r.loop.run_until(4.05e6)  # stretched periods from here
                start = {p.id: r.enforcer.sensor.gpu_time_us(p.id) for p in pods}
                polls, calls, processed = counts.polls, len(r.driver.calls), r.loop.processed
                partial = counts.partial
                r.loop.run_until(r.loop.now + seconds * 1e6)
                jobs = len(r.driver.calls) - calls  # each control job is a callback too
                results[f"{name}, {label}"] = {
                    "loop_callbacks_per_s": round(
                        (r.loop.processed - processed - jobs) / seconds, 2
                    ),
                    "sensor_polls_per_s": round((counts.polls - polls) / seconds, 2),
                    "holder_only_polls_per_s": round((counts.partial - partial) / seconds, 2),
                    "rm_controls_per_s": round(jobs / seconds, 2),
                    "gpu_time_per_wall": [
                        round(
                            (r.enforcer.sensor.gpu_time_us(p.id) - start[p.id]) / seconds / 1e6, 4
                        )
                        for p in pods
                    ],
                }
    results["10 busy pods, best-effort, default turns: how turns end"] = turn_ends(seconds=64.0)
    return results


def turn_ends(seconds: float) -> dict[str, Any]:
    """How the rig's turns end with 10 busy pods under best-effort at the daemon's default
    minimum turn, from the start: the periods, turns, turn ends (``qpolicy status --json``'s
    ``turn_ends``) and hand-overs (switches from one pod to another), to set beside a GPU
    host's (BENCHMARKS.md, 2026-12-02: an H200's pods saw 68 hand-overs in a clean 30 s
    window, ``tools/gpu/handovers.py``)."""
    import pytest

    from tests.unit import test_rm_enforcer as rig_module

    pods = [PodSpec(f"/p{i}", 0) for i in range(10)]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        r = rig_module.rig(
            Path(tmp), patch, pods, GpuPolicy.BEST_EFFORT, min_turn_us=DEFAULT_MIN_TURN_MS * 1000
        )
        r.loop.run_until(seconds * 1e6)
        stats = r.enforcer.scheduler.stats
        return {
            "seconds": seconds,
            "periods": stats.periods,
            "turns": stats.turns,
            "handovers": stats.switches,
            "turn_ends": dict(sorted(stats.ends.items())),
        }


def run(seconds: float = 20.0, gsp_us: float = 1000.0, map_read_us: float = 50.0) -> dict[str, Any]:
    results: dict[str, Any] = {
        "target_percent": TARGET_PERCENT,
        "period_ms": 50,
        "min_turn_ms": DEFAULT_MIN_TURN_MS,
        "gsp_us_per_control": gsp_us,
        "map_read_us": map_read_us,
        "seconds": seconds,
        "runs": {},
    }
    row = functools.partial(measure, seconds=seconds, gsp_us=gsp_us, map_read_us=map_read_us)
    for pods in (10, 2):
        # Interleaved, the same machine noise for each.
        for label, fixed in MODES.items():
            results["runs"][f"{pods} pods, {label}"] = row(pods, fixed_poll_us=fixed)
        if pods == 10:
            # What a GPU host's own nvidia-smi calls add (six tracker changes a second).
            results["runs"]["10 pods, after, tracker moved 6 times a second"] = row(
                pods, fixed_poll_us=None, churn_per_s=6.0
            )
            # The default before 2026-11-26 (c), same run: twice the turn switches.
            results["runs"]["10 pods, after, 200 ms turns"] = row(
                pods, fixed_poll_us=None, min_turn_ms=200.0
            )
    # make bench-gpu's online rows: nothing to gate there, so the loop steps once a second and
    # looks at no pod in between (quiet periods, 2026-12-07); before, 20 steps a second.
    for label, fixed in MODES.items():
        if fixed == MODES["before: 25 ms polls"]:
            continue  # the loop of before 2026-11-25 is not what this row compares with
        results["runs"][f"online + trainer, {label}"] = row(2, fixed_poll_us=fixed, online=True)
    results["virtual_time"] = virtual()
    ten = results["runs"]["10 pods, after: looks when due"]
    results["meets_target"] = ten["cpu_percent"] <= TARGET_PERCENT
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gsp-us", type=float, default=1000.0, help="CPU per RM control")
    parser.add_argument("--map-read-us", type=float, default=50.0, help="CPU per counter read")
    parser.add_argument("--virtual-only", action="store_true", help="only the virtual-time rows")
    args = parser.parse_args()
    if args.virtual_only:
        print(json.dumps(virtual(), indent=2))
    else:
        print(json.dumps(run(args.seconds, args.gsp_us, args.map_read_us), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
