"""qgpu.ko in the VM: loading it over nvmock, cgroups for pods, gpuload placed in them."""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpolicy.enforcers.kmod.client import CgroupStats, QgpuClient, QgpuEvent
from qpolicy.enforcers.kmod.sysfs import PARAMS_ROOT
from qpolicy.enforcers.kmod.uapi import Event
from qpolicy.telemetry.cgroups import cgroup_id
from tests.vm.gpuload import Gpuload, start_together
from tests.vm.linetenant import LineTenant
from tests.vm.nvmock import ROOT, processes, reset

QGPU = ROOT / "kmod" / "qgpu" / "qgpu.ko"
SYSFS = Path("/sys/kernel/qgpu")
CGROUP_ROOT = Path("/sys/fs/cgroup")


# kmod/qgpu/userd.c's COLD_AFTER_MS: a channel showing no work this long is read only every
# cold_look_us.
COLD_AFTER_S = 1.0
COLD_LOOK = PARAMS_ROOT / "cold_look_us"
DORMANT_LOOK = PARAMS_ROOT / "dormant_look_us"


def sched_counts(gpu: int = 0) -> tuple[int, int]:
    """qgpu's scheduler passes on ``gpu`` so far and the USERD reads they made (sysfs). The two
    files are read one after the other, each under the module's lock, so a pass or a few can
    fall between them: compare differences as ratios, not exactly."""
    directory = SYSFS / f"gpu{gpu}"
    return int((directory / "passes").read_text()), int((directory / "userd_reads").read_text())


def ensure_cgroup2() -> None:
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        subprocess.run(["mount", "-t", "cgroup2", "none", str(CGROUP_ROOT)], check=True)


def insmod(**params: object) -> None:
    args = [f"{key}={value}" for key, value in {"target": "nvmock", **params}.items()]
    subprocess.run(["insmod", str(QGPU), *args], check=True)


def rmmod() -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rmmod", "qgpu"], capture_output=True, text=True, check=False)


def loaded() -> bool:
    return SYSFS.exists()


@contextmanager
def module_loaded(**params: object) -> Iterator[None]:
    """qgpu loaded for the block, and unloaded cleanly after it."""
    insmod(**params)
    try:
        yield
    finally:
        result = rmmod()
        assert result.returncode == 0, result.stderr


@contextmanager
def qgpu_loaded(**params: object) -> Iterator[QgpuClient]:
    with module_loaded(**params), QgpuClient.open() as client:
        yield client


@dataclass
class Cgroup:
    path: Path

    @property
    def id(self) -> int:
        return cgroup_id(self.path)

    def procs(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]


@contextmanager
def cgroups(n: int) -> Iterator[list[Cgroup]]:
    ensure_cgroup2()
    made = [Cgroup(CGROUP_ROOT / f"qgpu-test-{uuid.uuid4().hex[:8]}") for _ in range(n)]
    for cg in made:
        cg.path.mkdir()
    try:
        yield made
    finally:
        for cg in made:
            for pid in cg.procs():
                with suppress(ProcessLookupError):
                    os.kill(pid, 9)
            for _ in range(100):
                try:
                    cg.path.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def remove_tree(path: Path) -> None:
    """A cgroup directory and everything below it, its processes killed."""
    if not path.exists():
        return
    for child in [p for p in path.iterdir() if p.is_dir()]:
        remove_tree(child)
    for pid in (path / "cgroup.procs").read_text().split():
        with suppress(ProcessLookupError):
            os.kill(int(pid), 9)
    for _ in range(100):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.05)


@contextmanager
def cgroup_tree(prefix: str) -> Iterator[Path]:
    """A cgroup of the test's own under the VM's cgroup2 root, removed with everything below it
    (their processes killed) afterwards."""
    ensure_cgroup2()
    path = CGROUP_ROOT / f"{prefix}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        remove_tree(path)


def in_cgroup(cg: Cgroup, args: list[str], nice: int = 0) -> Gpuload:
    """gpuload started inside ``cg`` (it moves itself before exec), ``nice`` added to its nice
    value."""
    return Gpuload(args, cgroup=str(cg.path), nice=nice)


def run_in_cgroup(
    cg: Cgroup, argv: list[str], **kwargs: object
) -> subprocess.CompletedProcess[str]:
    def enter() -> None:
        (cg.path / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(argv, preexec_fn=enter, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


def gpu_seconds(pid: int, gpu: int = 0) -> float:
    return processes(gpu).get(pid, 0) / 1e9


def gpu_shares(
    client: QgpuClient,
    cgs: list[Cgroup],
    shares: tuple[int, ...],
    load: list[str],
    period_us: int,
    policy: str = "fixed-share",
) -> tuple[list[dict[str, Any]], list[float]]:
    """``policy`` (fixed-share by default) with ``shares`` (offline) for ``cgs``, one gpuload
    ``load`` in each, started together: their reports and the percent of the GPU time each got
    (nvmock's ground truth)."""
    client.set_gpu(0, policy, period_us)
    for cg, share in zip(cgs, shares, strict=True):
        client.set_cgroup(cg.id, 0, "offline", share)
    reset()
    loads = start_together(*(load for _ in cgs), cgroups=[str(c.path) for c in cgs])
    reports = [one.result() for one in loads]
    seconds = [gpu_seconds(one.pid) for one in loads]
    return reports, [s / sum(seconds) * 100 for s in seconds]


def side_by_side(
    online: Cgroup, offline: Cgroup, request: list[str], saturate: list[str]
) -> tuple[dict[str, Any], float]:
    """Online requests (``request``) next to a saturating offline pod (``saturate``), started
    together: the online report and the offline pod's share of the GPU."""
    reset()
    infer, train = start_together(request, saturate, cgroups=[str(online.path), str(offline.path)])
    served = infer.result()
    wall = train.result()["elapsed_s"]
    return served, gpu_seconds(train.pid) / wall


def native_then_online(
    client: QgpuClient,
    online: Cgroup,
    offline: Cgroup,
    request: list[str],
    saturate: list[str],
    period_us: int,
) -> tuple[dict[str, Any], float, dict[str, Any], float]:
    """side_by_side() under native time-slicing, then again with ``online`` configured online
    and ``offline`` offline (best-effort, 50 each): the online report and the offline pod's
    share of each run."""
    native, native_offline = side_by_side(online, offline, request, saturate)
    client.set_gpu(0, "best-effort", period_us)
    client.set_cgroup(online.id, 0, "online", 50)
    client.set_cgroup(offline.id, 0, "offline", 50)
    gated, gated_offline = side_by_side(online, offline, request, saturate)
    return native, native_offline, gated, gated_offline


def tenant(cg: Cgroup, *args: str) -> dict[str, Any]:
    """tests/vm/tenant.py run inside ``cg``: its JSON report."""
    result = run_in_cgroup(cg, [sys.executable, "-m", "tests.vm.tenant", *args], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


class HeldTenant(LineTenant):
    """tests/vm/tenant.py's ``hold`` inside a cgroup: a process with a TSG of its own, which
    sends its own timeslice controls when asked."""

    def __init__(self, cg: Cgroup, comm: str | None = None) -> None:
        super().__init__(cg.path, "tests.vm.tenant", "hold", *(["--comm", comm] if comm else []))
        self.pid, self.client, self.tsg = self.hello["pid"], self.hello["client"], self.hello["tsg"]

    def set_timeslice(self, us: int, target: HeldTenant | None = None) -> int:
        """The tenant's own SET_TIMESLICE on its TSG (or naming ``target``'s client and TSG):
        RM's status as the tenant sees it."""
        named = "" if target is None else f" {target.client} {target.tsg}"
        return int(self.ask(f"set {us}{named}")["status"])

    def compute(self) -> int:
        """A channel with a compute object in its TSG, as CUDA makes its context's: the
        channel's handle."""
        return int(self.ask("compute")["channel"])

    def set_mode(self, mode: int) -> int:
        """The tenant's own GR_SET_CTXSW_PREEMPTION_MODE on its TSG, compute mode ``mode``:
        RM's status as the tenant sees it."""
        return int(self.ask(f"mode {mode}")["status"])

    def timeslice(self) -> int:
        """GET_TIMESLICE on its TSG, as the tenant sees it."""
        answer = self.ask("get")
        assert answer["status"] == 0, answer
        return int(answer["timeslice_us"])


@contextmanager
def held_tenants(*cgs: Cgroup) -> Iterator[list[HeldTenant]]:
    tenants: list[HeldTenant] = []
    try:
        for cg in cgs:
            tenants.append(HeldTenant(cg))
        yield tenants
    finally:
        for held in tenants:
            held.close()


def stats_of(client: QgpuClient, cg: Cgroup) -> CgroupStats:
    for stats in client.cgroups():
        if stats.cgroup_id == cg.id:
            return stats
    raise AssertionError(f"cgroup {cg.path.name} is not configured")


def drain(client: QgpuClient, quiet: float) -> list[QgpuEvent]:
    """Every event until none came for ``quiet`` seconds (after ``subscribe_events``). pyroute2
    reads every datagram the socket has into a queue of its own but answers one datagram a
    call: that queue is emptied before waiting on the socket again."""
    sock = client.transport._socket  # type: ignore[attr-defined]
    queued = sock.asyncore.msg_queue.queues[0]
    seen: list[QgpuEvent] = []
    while not queued.empty() or select.select([sock.fileno()], [], [], quiet)[0]:
        seen.extend(client.events())
    return seen


def refusal_events(events: list[QgpuEvent]) -> list[tuple[Event, int | None]]:
    """The OOM and DENIED events among ``events``, each with the cgroup it names."""
    return [(e.event, e.cgroup_id) for e in events if e.event in (Event.OOM, Event.DENIED)]


def refcount(module: str) -> int:
    return int(Path(f"/sys/module/{module}/refcnt").read_text())


def gpu_rates(pids: list[int], seconds: float, step: float) -> list[list[float]]:
    """The fraction of each window's wall time that each process had the engine, in consecutive
    windows of about ``step`` seconds. Each window is divided by its own length as the clock
    measured it: on a slow TCG host a 0.5 s sleep returned late enough that dividing by 0.5 read
    a lone process at 1.06-1.18 of the engine (CI, 2026-12-06)."""
    rows = []
    last = [processes().get(p, 0) for p in pids]
    t_last = time.monotonic()
    end = t_last + seconds
    while t_last < end:
        time.sleep(step)
        now = [processes().get(p, 0) for p in pids]
        t_now = time.monotonic()
        rows.append([(n - o) / 1e9 / (t_now - t_last) for n, o in zip(now, last, strict=True)])
        last, t_last = now, t_now
    return rows


HAND_BACKS = 3


def burst_hand_back(
    client: QgpuClient, cgs: list[Cgroup], saturate: list[str], period_us: int
) -> tuple[float, float, list[float]]:
    """Burst-share 30/70 with B idle, then B busy: the fraction of the engine A got alone, A's
    share next to B over 3 s from one period after B has work, and A's share in the first 0.5 s
    from one period after B has work, for each of HAND_BACKS processes of B started one after
    another (A alone between them). One 0.5 s window of a TCG guest moves by a few points
    (0.26-0.35 in eight runs of one), about what a hand-back a period late adds (0.07), so the
    hand-back is judged on the mean of several."""
    a_cg, b_cg = cgs
    client.set_gpu(0, "burst-share", period_us)
    client.set_cgroup(a_cg.id, 0, "offline", 30)
    client.set_cgroup(b_cg.id, 0, "offline", 70)
    reset()
    # A runs until it is told to stop: a fixed length (18 s until 2026-12-06) ended it before the
    # last window where starting each B took longer (a slower TCG host: A's share read 0.000).
    a = in_cgroup(a_cg, [*saturate, "--seconds", "600"]).ready()
    time.sleep(1.0)
    # B idle: A gets the GPU, not just its 30 % (a saturating process alone keeps the VM's
    # engine busy about 90 % of the time).
    alone = gpu_rates([a.pid], 2.0, 0.5)
    lent = statistics.mean(r[0] for r in alone)

    def b_has_work() -> Gpuload:
        # B runs until it is stopped, as A does: with a fixed length (1.2 s until 2026-12-07)
        # starting B and waiting for its first work took long enough on a slower TCG host (CI)
        # that B had ended inside the window, and A's share there read 1.000.
        b = in_cgroup(b_cg, [*saturate, "--seconds", "600"]).ready()
        start = processes().get(b.pid, 0)
        while processes().get(b.pid, 0) == start:
            time.sleep(0.005)
        # From one period after B has work, the split is 30:70 again.
        time.sleep(period_us / 1e6)
        return b

    def stop(p: Gpuload) -> None:
        p.proc.send_signal(signal.SIGTERM)
        assert p.result()["interrupted"], "a process ended before it was stopped"

    firsts = []
    for _ in range(HAND_BACKS):
        b = b_has_work()
        (window,) = gpu_rates([a.pid, b.pid], 0.5, 0.5)
        stop(b)
        firsts.append(window[0] / (window[0] + window[1]))
        time.sleep(0.5)  # A alone again
    b = b_has_work()
    # Over 3 s: a TCG guest's timing makes a shorter window noisy by a few points.
    both = gpu_rates([a.pid, b.pid], 3.0, 0.5)
    stop(b)
    stop(a)
    a_share = sum(r[0] for r in both) / sum(r[0] + r[1] for r in both)
    return lent, a_share, firsts
