"""``make bench-gpu``: native time-slicing, MPS and qpolicy's rm enforcer, side by side on one GPU.

Run as root on a machine with an NVIDIA GPU, PyTorch and bcc (tools/gpu/bench-gpu.sh prepares the
lent GPU machine). For each scenario and matrix size the same PyTorch processes run three times:

* **native**: the driver's own time-slicing;
* **mps**: an MPS server, each client capped with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its share;
* MPS without the cap, for online rows (asked for with ``--modes``; ``MPS_MODES``): **mps-open**
  no cap and no priority; **mps-priority** no cap, the offline pods' clients at
  ``CUDA_MPS_CLIENT_PRIORITY`` = 1 (below normal), the online ones at 0 (normal);
  **mps-priority-capped** the same with each offline client capped at its share, the online ones
  not: one context for all, so no context switch, and the online kernels' blocks placed first;
* **qpolicy-pod-mps** (online rows, asked for with ``--modes``): qpolicy, with the processes of an
  offline pod of several run as clients of an MPS server of that pod's own, started in its
  cgroup: one context for the pod, which the offline timeslice then switches against the online
  pod alone;
* **qpolicy**: ``qpolicy daemon --enforcer rm`` with the scenario's policy and the pods' cgroups;
* **qpolicy-annotated** (online rows, asked for with ``--modes``): the same, the pods told to the
  running daemon by annotations on their cgroups instead of its state file (the GPU host's
  kernel keeping and reporting them: tools/gpu/annotated_pods.py).

A pod's achieved share is its throughput divided by the same process's throughput alone on the GPU
(measured first, in the same run); an online row's latency is held against the online stream alone,
measured in the same run before the rows and again after them (row_solo()). Every process starts
its timed loop at the same wall-clock moment, after its CUDA initialisation. Scenarios: fixed-share
70/30 and 50/30/20, burst-share with one pod idle half the time, best-effort with 3 pods, at n =
2048, 4096, 8192; a fixed-share pod alone; an online pod (4096 matmuls at 150 Hz) next to an
offline 8192 trainer, a 2048 trainer, two 8192 trainers and an offline pod of two; two online pods
next to an 8192 trainer; requests of four matmuls with host work between them next to an 8192
trainer; and the daemon's CPU with 10 pods.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from qpolicy.doctor.report import percentile  # noqa: E402
from qpolicy.doctor.targets import (  # noqa: E402
    P50_BOUND,
    P99_BOUND,
    TRAINER_FLOOR,
    UNSTABLE_SOLO,
    against_solo,
    better_than,
    solo_unstable,
    stricter_solo,
    trainer_kept,
)
from qpolicy.enforcers.strategy import (  # noqa: E402
    DOCTOR_SCHEMA,
    PREEMPTION_LEVERS,
    TIMESLICE_LEVERS,
    doctor_cache_path,
)
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec  # noqa: E402
from qpolicy.state import DesiredState, StateStore, default_state_dir  # noqa: E402
from qpolicy.telemetry.cgroups import cgroup2_mount  # noqa: E402
from tools.gpu import annotated_pods, late_tails  # noqa: E402
from tools.gpu.host_noise import StealWatch  # noqa: E402

MATMUL = ROOT / "tools" / "gpu" / "matmul.py"
INIT_S = 8.0
# The daemon's CPU is measured over the pods' run less this much at either end.
CPU_EDGE_S = 1.0
# A pod's timeline has an entry per finished batch; a gap of this many of its typical batch
# times means the GPU was elsewhere (4096 alone: a batch every 1.7 ms; ten pods' 400 ms turns:
# gaps of 3.6 s; the 10 ms turns of a period not stretched: gaps of 90 ms).
HANDOVER_GAP_BATCHES = 5.0
# As tools/deploy/kubernetes/servicemonitor.yaml asks Prometheus to scrape.
SCRAPE_EVERY_S = 15.0
# Online rows: 150 requests/s for --online-seconds (default 20 s: 3 000 requests, enough for a p99
# of 30 samples above it and a p99.9 of 3).
ONLINE_HZ = 150.0
# An online stream that finished this much later than its last request was due fell behind: its
# requests queued, and whatever ran beside it took GPU time the stream was owed (call BA, H100:
# native time-slicing 2.5 s behind with requests of four kernels).
BEHIND_S = 0.5
# The MPS modes: (offline clients capped at their share, online clients capped at theirs,
# offline clients below normal priority). NVIDIA's MPS guide: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
# CUDA_MPS_CLIENT_PRIORITY (0 normal, 1 below normal).
MPS_MODES = {
    "mps": (True, True, False),
    "mps-open": (False, False, False),
    "mps-priority": (False, False, True),
    "mps-priority-capped": (True, False, True),
}
MPS_ENV = {
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/qpolicy-mps/pipe",
    "CUDA_MPS_LOG_DIRECTORY": "/tmp/qpolicy-mps/log",
}


@dataclass(frozen=True)
class Pod:
    name: str
    share: int | None
    pod_class: PodClass = PodClass.OFFLINE
    n: int | None = None  # None: the scenario's size
    requests_hz: float | None = None
    late: bool = False  # starts half way through
    # Online: matmuls per request, and host work (ms) between them (tools/gpu/matmul.py).
    request_kernels: int = 1
    request_gap_ms: float = 0.0
    # The pod (cgroup) the process runs in: its own by default; another Pod's name makes it a
    # second process of that pod, which the daemon governs as one.
    pod: str | None = None
    # Offline: matmuls between the trainer's waits for its results (1: a loop that waits for
    # each, which its channel shows as pending only for µs: tools/gpu/userd_fetch.py).
    sync_every: int = 8
    # Offline: how it waits for them (tools/gpu/matmul.py --wait): "sync", "poll", "host" (after
    # host_ms of host work) or "copy" (a synchronous copy of the result).
    wait: str = "sync"
    host_ms: float = 0.0

    @property
    def cgroup(self) -> str:
        return self.pod or self.name


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: GpuPolicy
    pods: tuple[Pod, ...]
    sizes: tuple[int, ...] = (2048, 4096, 8192)
    modes: tuple[str, ...] = ("native", "mps", "qpolicy")


# The one-stream solo every online row is held against unless its requests differ (own_solo()):
# 4096 matmuls, one a request, at ONLINE_HZ.
SOLO_STREAM = Pod("online", None, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ)


def _long_loop(pod: Pod) -> Pod:
    """``pod`` as a loop of 32768 matmuls (~0.1 s each), each waited for before the next."""
    return dataclasses.replace(pod, n=32768, sync_every=1)


def _trainer_beside_a_long_loop(how: str, loop: Pod) -> Scenario:
    """Best-effort: an 8192 trainer beside a long loop (``how``: the name's end, which says how
    the loop waits for its kernels)."""
    return Scenario(
        f"best-effort: an 8192 trainer beside 32768 matmuls{how}",
        GpuPolicy.BEST_EFFORT,
        (Pod("a", None, n=8192), _long_loop(loop)),
        sizes=(8192,),
        modes=("native", "qpolicy"),
    )


def _online_beside_a_trainer_and_a_long_loop(how: str, loop: Pod) -> Scenario:
    """An online stream next to an 8192 trainer and a long loop (``how``: the name's end)."""
    return Scenario(
        f"online 4096 @ {ONLINE_HZ:g} Hz next to an 8192 trainer and 32768 matmuls{how}",
        GpuPolicy.BURST_SHARE,
        (
            Pod("online", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("trainer", 40, n=8192),
            _long_loop(loop),
        ),
        sizes=(0,),
        modes=("native", "qpolicy"),
    )


SCENARIOS = (
    Scenario("fixed-share 70/30", GpuPolicy.FIXED_SHARE, (Pod("a", 70), Pod("b", 30))),
    Scenario(
        "fixed-share 50/30/20", GpuPolicy.FIXED_SHARE, (Pod("a", 50), Pod("b", 30), Pod("c", 20))
    ),
    Scenario("fixed-share 30 alone", GpuPolicy.FIXED_SHARE, (Pod("a", 30),)),
    Scenario(
        "fixed-share 50/50, b waiting for each result",
        GpuPolicy.FIXED_SHARE,
        (Pod("a", 50), Pod("b", 50, sync_every=1)),
        sizes=(8192,),
    ),
    Scenario(
        "burst-share 50/50, b idle the first half",
        GpuPolicy.BURST_SHARE,
        (Pod("a", 50), Pod("b", 50, late=True)),
    ),
    Scenario(
        "best-effort, 3 pods",
        GpuPolicy.BEST_EFFORT,
        (Pod("a", None), Pod("b", None), Pod("c", None)),
    ),
    Scenario(
        f"online 4096 @ {ONLINE_HZ:g} Hz next to an offline 8192 trainer",
        GpuPolicy.BURST_SHARE,
        (
            Pod("online", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("trainer", 80, n=8192),
        ),
        sizes=(0,),
    ),
    Scenario(
        f"online 4096 @ {ONLINE_HZ:g} Hz next to an offline 2048 trainer (short kernels)",
        GpuPolicy.BURST_SHARE,
        (
            Pod("online", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("trainer", 80, n=2048),
        ),
        sizes=(0,),
    ),
    Scenario(
        # Two offline pods: the daemon gives them exclusive turns (enforcers/slicer.py), so the
        # short offline timeslice never has two of their TSGs runnable at once. Their
        # throughput, summed, against native's.
        f"online 4096 @ {ONLINE_HZ:g} Hz next to two offline 8192 trainers",
        GpuPolicy.BURST_SHARE,
        (
            Pod("online", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("trainer", 40, n=8192),
            Pod("trainer2", 40, n=8192),
        ),
        sizes=(0,),
    ),
    Scenario(
        # One offline pod of two processes: two TSGs open together under the short offline
        # timeslice. Do they switch among themselves at every slice (the doctor measures one
        # trainer)? Their throughput, summed, against native's.
        f"online 4096 @ {ONLINE_HZ:g} Hz next to an offline pod of two 8192 trainers",
        GpuPolicy.BURST_SHARE,
        (
            Pod("online", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("trainer", 80, n=8192),
            Pod("trainer2", None, n=8192, pod="trainer"),
        ),
        sizes=(0,),
    ),
    Scenario(
        # Two online pods: each its own stream, both at the online timeslice. Does the class
        # hold for several online pods (each may wait behind the other's request, never behind
        # the trainer's slice)? Their requests, merged, against one stream alone.
        f"two online pods, 4096 @ {ONLINE_HZ:g} Hz each, next to an offline 8192 trainer",
        GpuPolicy.BURST_SHARE,
        (
            Pod("online", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("online2", 20, PodClass.ONLINE, n=4096, requests_hz=ONLINE_HZ),
            Pod("trainer", 60, n=8192),
        ),
        sizes=(0,),
    ),
    Scenario(
        # Requests of several kernels with host work between them, as a model's steps are: the
        # online channel empties between kernels, so the trainer gets the GPU back in each gap
        # and each kernel costs a switch. Does the short offline timeslice then cost the trainer
        # throughput (docs/levers.md: what the doctor's one-kernel requests cannot show)?
        f"online 4 x 4096 with 0.5 ms host gaps @ {ONLINE_HZ:g} Hz next to an offline 8192 trainer",
        GpuPolicy.BURST_SHARE,
        (
            Pod(
                "online",
                20,
                PodClass.ONLINE,
                n=4096,
                requests_hz=ONLINE_HZ,
                request_kernels=4,
                request_gap_ms=0.5,
            ),
            Pod("trainer", 80, n=8192),
        ),
        sizes=(0,),
    ),
    # A loop of long kernels (32768 matmuls, ~0.1 s each) waited for one by one launches nothing
    # for longer than the rm enforcer's idle grace (50 ms) while its kernel runs, so its turns end
    # "idle" and it is left open beside the trainer (enforcers/slicer.py: _step_aside). Without
    # an online pod the TSGs keep their own timeslices: does the hardware's time-slicing then run
    # both? With an online pod the offline TSGs hold the short offline timeslice, and two offline
    # TSGs with work at 1 us switch at every slice (a pod of two 8192 trainers kept 0.04 % of its
    # throughput, BENCHMARKS.md, sixth session). Does the long loop, left open beside the
    # trainer, stall both?
    _trainer_beside_a_long_loop(" waited for one by one", Pod("b", None)),
    _online_beside_a_trainer_and_a_long_loop(" waited for one by one", Pod("long", 40)),
    # The same loop polling its stream (cudaStreamQuery every 0.5 ms) instead of waiting in a
    # synchronize call: it launches nothing and waits in no call while each kernel runs.
    _trainer_beside_a_long_loop(" polled for one by one", Pod("b", None, wait="poll")),
    _online_beside_a_trainer_and_a_long_loop(
        " polled for one by one", Pod("long", 40, wait="poll")
    ),
    # The same loop copying each result back with a synchronous copy (cuMemcpyDtoH_v2): it
    # waits inside the copy and makes no synchronize or query call.
    _trainer_beside_a_long_loop(" copied back one by one", Pod("b", None, wait="copy")),
    _online_beside_a_trainer_and_a_long_loop(
        " copied back one by one", Pod("long", 40, wait="copy")
    ),
    # Host work (80 ms) after each launch, then the wait: for the 30 ms past the rm enforcer's
    # 50 ms grace the loop shows nothing at all (README: what the rm enforcer cannot see). How
    # much does that cost it and the trainer?
    _online_beside_a_trainer_and_a_long_loop(
        ", 80 ms of host work after each launch", Pod("long", 40, wait="host", host_ms=80.0)
    ),
    Scenario(
        "daemon CPU, 10 pods",
        GpuPolicy.BEST_EFFORT,
        tuple(Pod(f"p{i}", None) for i in range(10)),
        sizes=(4096,),
        modes=("qpolicy",),
    ),
)

# Extra arguments for every daemon the bench starts (--daemon-arg): a lever tried as is.
DAEMON_ARGS: list[str] = []
# Extra arguments for every online request stream (online_args()).
ONLINE_ARGS: list[str] = []
# --strategy: None takes the node's doctor cache, as production does; "default" none (the engine's
# timeslices); a lever of TIMESLICE_LEVERS a cache that recommends it (doctor_cache()).
STRATEGIES = ("default", *TIMESLICE_LEVERS)
STRATEGY: list[str] = []


def doctor_cache(lever: str) -> dict[str, Any]:
    """A doctor result that recommends ``lever`` and says it was forced by the bench: to compare
    timeslice pairs side by side on one host, whatever the node's doctor would pick. A lever that
    also sets offline contexts' preemption mode (CTA) is marked as checked next to long kernels:
    forced, it is meant to be measured whole, and without the mark the enforcers would take its
    timeslices only (qpolicy.enforcers.strategy.from_doctor), as a run of 2026-12-03 did."""
    checked = {"long_kernels_checked": True} if lever in PREEMPTION_LEVERS else {}
    return {
        "schema": DOCTOR_SCHEMA,
        "date": "make bench-gpu --strategy",
        "recommendation": {
            "lever": lever,
            "why": "forced by make bench-gpu --strategy",
            **checked,
        },
    }


def place_doctor_cache(state_dir: Path) -> None:
    """The daemon's doctor cache for GPU 0 in ``state_dir``, as --strategy asks."""
    target = doctor_cache_path(state_dir, 0)
    chosen = STRATEGY[0] if STRATEGY else None
    if chosen is None:
        # As in production: the operator's state directory's cache goes along.
        node = doctor_cache_path(default_state_dir(), 0)
        if node.is_file():
            shutil.copyfile(node, target)
    elif chosen != "default":
        target.write_text(json.dumps(doctor_cache(chosen)))


def online_args(timed: bool) -> list[str]:
    """What each online stream is told: its request is its matmul alone unless ``timed`` (CUDA
    events before and after it, submitted apart from it: see --online-timed)."""
    return [] if timed else ["--plain"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stat_cpu_seconds(stat: Path) -> tuple[float, float]:
    """(user, system) CPU seconds from a /proc stat file (a process's or one thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its threads."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the daemon's: the rm enforcer's guard)."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                children += [int(c) for c in (task / "children").read_text().split()]
    return children


def children_cpu_seconds(pid: int) -> dict[int, tuple[float, float]]:
    """Per live child of ``pid``, its (user, system) CPU seconds."""
    out: dict[int, tuple[float, float]] = {}
    for child in child_pids(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            out[child] = cpu_seconds(child)
    return out


def threads_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Per live thread of ``pid``: its kernel name (the daemon names its threads qp-ROLE;
    the main thread, the daemon's loop, is "main") and its user + system CPU seconds."""
    out: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                tid = int(task.name)
                name = "main" if tid == pid else (task / "comm").read_text().strip()
                out[tid] = (name, sum(stat_cpu_seconds(task / "stat")))
    return out


def threads_percent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], window: float
) -> dict[str, float]:
    """% of a core per thread name over ``window``, for threads that lived through it (a
    scrape's thread lives for one request: its CPU is only in the process's total)."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        if tid in before:
            out[name] = out.get(name, 0.0) + 100 * (cpu - before[tid][1]) / window
    return dict(sorted(out.items()))


def cpu_window_of(pid: int, window: float) -> tuple[float, float, float]:
    """(user, system) CPU seconds of ``pid`` over ``window`` seconds, and those of its child
    processes (the guard: part of what qpolicy costs the node) that lived through it."""
    user0, sys0 = cpu_seconds(pid)
    kids0 = children_cpu_seconds(pid)
    time.sleep(window)
    user1, sys1 = cpu_seconds(pid)
    kids1 = children_cpu_seconds(pid)
    kids = sum(sum(kids1[c]) - sum(kids0[c]) for c in kids1 if c in kids0)
    return user1 - user0, sys1 - sys0, kids


def turn_counts(status_path: Path) -> dict[str, Any] | None:
    """GPU 0's periods, stretched periods and turn ends so far, from the daemon's status file
    (written about once a second), or None where it cannot be read."""
    try:
        backend = json.loads(status_path.read_text())["backend"]
        gpu_status = backend["gpus"]["0"]
        period = gpu_status.get("period_us")
        writes = backend.get("handle_writes")
        changes = backend.get("tracker_changes")
        unchanged = backend.get("handle_unchanged")
        return {
            "periods": int(gpu_status["periods"]),
            "periods_stretched": int(gpu_status["periods_stretched"]),
            "turn_ends": {str(k): int(v) for k, v in gpu_status["turn_ends"].items()},
            # The period in force at the read (older daemons did not say: None).
            "period_us": None if period is None else float(period),
            # The handle file's rewrites (older daemons did not count them: None).
            "handle_writes": None if writes is None else int(writes),
            # Why it was written, and what changed the tracker, by cause and by cgroup (older
            # daemons did not say: None).
            "handle_writes_why": _counts(backend.get("handle_writes_why")),
            # Looks that left the file as it was (older daemons did not count them: None).
            "handle_unchanged": None if unchanged is None else int(unchanged),
            "tracker_changes": None if changes is None else _counts(changes["by_cause"]),
            "tracker_changes_by_cgroup": None
            if changes is None
            else {c["cgroup"] or "?": int(c["changes"]) for c in changes["busiest"]},
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _counts(counts: Any) -> dict[str, int] | None:
    return None if counts is None else {str(k): int(v) for k, v in counts.items()}


def _grown(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """What each count of ``after`` grew by since ``before`` (those that grew, largest first)."""
    if before is None or after is None:
        return None
    grown = {key: count - before.get(key, 0) for key, count in after.items()}
    return dict(sorted(((k, v) for k, v in grown.items() if v > 0), key=lambda kv: -kv[1]))


def counts_difference(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any] | None:
    """What :func:`turn_counts` grew by between two reads (None if either is missing)."""
    if before is None or after is None:
        return None
    ends = {
        reason: count - before["turn_ends"].get(reason, 0)
        for reason, count in after["turn_ends"].items()
        if count != before["turn_ends"].get(reason, 0)
    }
    writes, unchanged = (
        None if before.get(key) is None or after.get(key) is None else after[key] - before[key]
        for key in ("handle_writes", "handle_unchanged")
    )
    return {
        "periods": after["periods"] - before["periods"],
        "periods_stretched": after["periods_stretched"] - before["periods_stretched"],
        "turn_ends": ends,
        "handle_writes": writes,
        "handle_unchanged": unchanged,
        **{
            key: _grown(before.get(key), after.get(key))
            for key in ("handle_writes_why", "tracker_changes", "tracker_changes_by_cgroup")
        },
    }


def pod_runs(timeline: list[float]) -> list[tuple[float, float]]:
    """The stretches a pod ran without a break: (first, last) batch times of each.

    A break is a gap of more than HANDOVER_GAP_BATCHES of the pod's typical (median) batch
    time: the GPU was another pod's meanwhile.
    """
    if not timeline:
        return []
    gaps = sorted(b - a for a, b in itertools.pairwise(timeline))
    limit = HANDOVER_GAP_BATCHES * (gaps[len(gaps) // 2] if gaps else 0.0)
    runs = []
    first = last = timeline[0]
    for t in timeline[1:]:
        if t - last > limit:
            runs.append((first, last))
            first = t
        last = t
    runs.append((first, last))
    return runs


def handovers_seen(pods: dict[str, Any], start: float, end: float) -> int | None:
    """How often the GPU passed from one pod to another between the wall times start and end,
    as the pods' own timelines (a batch time each, from their wall_start) show it.

    The count the daemon cannot get wrong: a turn it opened for the pod already holding the
    GPU, or a period that changed nothing, is no hand-over here. None without timelines.
    """
    runs = []
    for name, pod in pods.items():
        timeline, wall_start = pod.get("timeline"), pod.get("wall_start")
        if not timeline or wall_start is None:
            return None
        runs += [(wall_start + a, wall_start + b, name) for a, b in pod_runs(timeline)]
    runs.sort()
    return sum(
        1
        for before, run in itertools.pairwise(runs)
        if start <= run[0] < end and run[2] != before[2]
    )


@dataclass
class Cgroups:
    root: Path = field(default_factory=lambda: cgroup2_mount() / "qpolicy-bench")

    def path(self, pod: str) -> Path:
        directory = self.root / pod
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def id(self, pod: str) -> str:
        return "/" + str(self.path(pod).relative_to(cgroup2_mount()))

    def clean(self) -> None:
        if self.root.exists():
            for child in self.root.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                self.root.rmdir()


def in_cgroup(cgroup: Path, argv: list[str]) -> list[str]:
    """``argv`` run so that its process joins ``cgroup`` before it execs (and its children with
    it)."""
    return ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *argv]


def spawn(
    pod: Pod, n: int, seconds: float, start_at: float, cgroups: Cgroups, env: dict[str, str]
) -> subprocess.Popen[str]:
    argv = [sys.executable, str(MATMUL), "--n", str(pod.n or n), "--label", pod.name]
    if pod.requests_hz:
        argv += ["--requests-hz", str(pod.requests_hz), *ONLINE_ARGS]
        if pod.request_kernels > 1:
            argv += [
                "--request-kernels",
                str(pod.request_kernels),
                "--request-gap-ms",
                str(pod.request_gap_ms),
            ]
    else:
        if pod.sync_every != 8:
            argv += ["--sync-every", str(pod.sync_every)]
        if pod.wait != "sync":
            argv += ["--wait", pod.wait, "--host-ms", str(pod.host_ms)]
    if pod.late:
        argv += ["--start-at", str(start_at + seconds / 2), "--seconds", str(seconds / 2)]
    else:
        argv += ["--start-at", str(start_at), "--seconds", str(seconds), "--timeline"]
    return subprocess.Popen(
        in_cgroup(cgroups.path(pod.cgroup), argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect(processes: dict[str, subprocess.Popen[str]], timeout: float) -> dict[str, Any]:
    """Each process's result line; one that hangs is killed and recorded, the rest still count."""
    results: dict[str, Any] = {}
    deadline = time.time() + timeout
    for name, proc in processes.items():
        try:
            out, err = proc.communicate(timeout=max(deadline - time.time(), 1.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            results[name] = {"error": ["timed out", *err.strip().splitlines()[-5:]]}
            continue
        if proc.returncode != 0:
            results[name] = {"error": err.strip().splitlines()[-5:]}
            continue
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def shared_pods(scenario: Scenario) -> list[str]:
    """The cgroups of the offline pods with more than one process."""
    cgroups = [p.cgroup for p in scenario.pods if p.pod_class is PodClass.OFFLINE]
    return sorted({c for c in cgroups if cgroups.count(c) > 1})


def pod_mps_env(cgroup: str) -> dict[str, str]:
    """The pipe and log directories of one pod's own MPS server (qpolicy-pod-mps)."""
    return {name: f"{directory}-{cgroup}" for name, directory in MPS_ENV.items()}


def mode_env(mode: str, pod: Pod, scenario: Scenario | None = None) -> dict[str, str]:
    """What a pod's process is given on top of the bench's environment in ``mode``."""
    if mode == "qpolicy-pod-mps":
        shared = scenario is not None and pod.cgroup in shared_pods(scenario)
        return pod_mps_env(pod.cgroup) if shared else {}
    if mode not in MPS_MODES:
        return {}
    cap_offline, cap_online, below = MPS_MODES[mode]
    offline = pod.pod_class is PodClass.OFFLINE
    env = dict(MPS_ENV)
    if cap_offline if offline else cap_online:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pod.share or 100)
    if below:
        env["CUDA_MPS_CLIENT_PRIORITY"] = "1" if offline else "0"
    return env


@contextlib.contextmanager
def mps_server(
    dirs: dict[str, str] = MPS_ENV, cgroup: Path | None = None
) -> Iterator[dict[str, str]]:
    """An MPS control daemon with ``dirs``; in ``cgroup`` if given (the server it starts for the
    first client is its child, so its context's RM objects are that cgroup's)."""
    for directory in dirs.values():
        Path(directory).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **dirs}
    argv = ["nvidia-cuda-mps-control", "-d"]
    subprocess.run(argv if cgroup is None else in_cgroup(cgroup, argv), env=env, check=True)
    try:
        yield dirs
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, check=False)
        time.sleep(1.0)


def scrape_every(port: int, interval_s: float, stop: threading.Event, info: dict[str, Any]) -> None:
    """GET the daemon's /metrics every ``interval_s`` until ``stop``; counts in ``info``."""
    info["scrapes"] = 0
    while not stop.wait(interval_s):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
            info["scrapes"] += 1
        except OSError as error:
            info["scrape_error"] = str(error)


def probe_up(port: int) -> bool:
    """Whether the daemon serving /metrics on ``port`` says its probe is up (not yet: False)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return b"qpolicy_probe_up 1.0" in r.read()
    except OSError:
        return False


def desired_pods(scenario: Scenario, cgroups: Cgroups) -> list[PodSpec]:
    """The pods the daemon is told of: one per cgroup (a second process of a pod runs in it)."""
    return [
        PodSpec(cgroups.id(p.name), 0, p.pod_class, p.share) for p in scenario.pods if p.pod is None
    ]


@contextlib.contextmanager
def qpolicy_daemon(
    scenario: Scenario,
    cgroups: Cgroups,
    keep_log: Path | None = None,
    profile: Path | None = None,
    enforcer: str = "rm",
    annotated: bool = False,
) -> Iterator[dict[str, Any]]:
    """A daemon told of ``scenario``'s pods by its state file, or, ``annotated``, by annotations
    on their cgroups once it runs (its state file then holds the GPU's policy alone)."""
    with tempfile.TemporaryDirectory(prefix="qpolicy-bench-state-") as state_dir:
        # The daemon chooses its online timeslices from a doctor result (--strategy).
        place_doctor_cache(Path(state_dir))
        pods = desired_pods(scenario, cgroups)
        state = DesiredState().with_gpu(GpuConfig(0, scenario.policy))
        for pod in [] if annotated else pods:
            state = state.with_pod(pod)
        StateStore(state_dir).update(lambda _: state)
        port = free_port()
        # A file, not a pipe: a chatty daemon must never block on a pipe nobody reads.
        log_path = Path(state_dir) / "daemon.log"
        log_file = log_path.open("w")
        # cProfile sees the daemon's main thread (the loop, the probe, the sensor), not the
        # control worker's: where the daemon's CPU goes, at some cost to it.
        profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
        daemon = subprocess.Popen(
            [
                sys.executable,
                *profiler,
                "-m",
                "qpolicy",
                "daemon",
                "--enforcer",
                enforcer,
                "--metrics-addr",
                f"127.0.0.1:{port}",
                "--log-level",
                "info" if keep_log is None else "debug",
                *DAEMON_ARGS,
            ],
            env={
                **os.environ,
                "QPOLICY_STATE_DIR": state_dir,
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            },
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            text=True,
        )
        status_path = Path(state_dir) / "daemon-status.json"
        info: dict[str, Any] = {"port": port, "pid": daemon.pid, "status_path": status_path}
        deadline = time.time() + 60
        while time.time() < deadline:
            if daemon.poll() is not None:
                raise RuntimeError(f"qpolicy daemon exited: {log_path.read_text()[-2000:]}")
            if probe_up(port):
                break
            time.sleep(0.3)
        # Prometheus scrapes the daemon as the shipped ServiceMonitor asks (every 15 s): a scrape
        # reads the probe's counter maps, and its cost belongs in the daemon's CPU.
        stop_scraping = threading.Event()
        scraper = threading.Thread(
            target=scrape_every, args=(port, SCRAPE_EVERY_S, stop_scraping, info), daemon=True
        )
        scraper.start()
        # One cgroup per pod (desired_pods()); a second process of a pod runs in its pod's.
        annotated_cgroups = (
            [cgroups.path(p.name) for p in scenario.pods if p.pod is None] if annotated else []
        )
        try:
            if annotated:
                for directory, spec in zip(annotated_cgroups, pods, strict=True):
                    annotated_pods.annotate(directory, spec)
                # How long the running daemon took to list them (its status is written once a
                # second), and whether it watched or walked the hierarchy to learn of them.
                info["annotations_listed_after_s"] = annotated_pods.wait_until(
                    status_path, pods, listed=True
                )
                info["annotations"] = annotated_pods.watch_status(status_path)
            yield info
        finally:
            stop_scraping.set()
            scraper.join(timeout=10)
            try:
                status = json.loads(status_path.read_text())
                gpu_status = status["backend"]["gpus"]["0"]
                info["online_strategy"] = gpu_status["online_strategy"]
                # Its status at the end: GPU checks, turns handed back, and turn ends and
                # periods over its whole life (the CPU window's own are in window_turns).
                info["gpu_status"] = gpu_status
                # How the paths of the probe's cgroup ids were found: by id, or by walks.
                info["cgroup_ids"] = status.get("cgroup_ids")
            except (OSError, ValueError, KeyError, TypeError):
                info["online_strategy"] = None
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    info["metrics"] = [
                        line
                        for line in r.read().decode().splitlines()
                        if line.startswith(
                            ("qpolicy_gpu_time", "qpolicy_share_planned", "qpolicy_throttled")
                        )
                    ]
            except OSError as error:
                info["metrics_error"] = str(error)
            if annotated:
                # Last, once its status and metrics with the pods are read (a GPU without pods
                # drops out of the rm enforcer's status: call 56B, 2026-12-07, kept none).
                for directory in annotated_cgroups:
                    annotated_pods.unannotate(directory)
                # Annotations taken off end the pods: the daemon lets them go (and gives their
                # TSGs their own timeslices back) as it would a pod deleted from its state file.
                info["annotations_dropped_after_s"] = annotated_pods.wait_until(
                    status_path, pods, listed=False
                )
            daemon.send_signal(signal.SIGTERM)
            try:
                info["exit_code"] = daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
                info["exit_code"] = "killed"
            log_file.close()
            if keep_log is not None:
                shutil.copyfile(log_path, keep_log)
            info["stderr_tail"] = log_path.read_text().strip().splitlines()[-30:]


def run_once(
    scenario: Scenario,
    n: int,
    mode: str,
    seconds: float,
    cgroups: Cgroups,
    keep_log: Path | None = None,
    profile: Path | None = None,
) -> dict[str, Any]:
    env = dict(os.environ)
    start_at = time.time() + INIT_S
    with contextlib.ExitStack() as stack:
        steal = stack.enter_context(StealWatch())
        daemon_info: dict[str, Any] | None = None
        if mode in MPS_MODES:
            stack.enter_context(mps_server())
        if mode in ("qpolicy", "probe", "qpolicy-pod-mps", "qpolicy-annotated"):
            # probe: the daemon watching with nothing enforced (--enforcer none), to tell what
            # the probe alone costs the pods from what the enforcer does.
            enforcer = "none" if mode == "probe" else "rm"
            daemon_info = stack.enter_context(
                qpolicy_daemon(
                    scenario,
                    cgroups,
                    keep_log,
                    profile,
                    enforcer,
                    annotated=mode == "qpolicy-annotated",
                )
            )
            start_at = time.time() + INIT_S
        if mode == "qpolicy-pod-mps":
            for cgroup in shared_pods(scenario):
                stack.enter_context(mps_server(pod_mps_env(cgroup), cgroups.path(cgroup)))
        processes: dict[str, subprocess.Popen[str]] = {}
        for pod in scenario.pods:
            processes[pod.name] = spawn(
                pod, n, seconds, start_at, cgroups, env | mode_env(mode, pod, scenario)
            )
        cpu_window: tuple[float, float, float] | None = None
        threads_before: dict[int, tuple[str, float]] = {}
        threads_after: dict[int, tuple[str, float]] = {}
        window_at = 0.0
        counts_before: dict[str, Any] | None = None
        counts_after: dict[str, Any] | None = None
        window = seconds - 2 * CPU_EDGE_S
        if daemon_info is not None:
            # The pods' steady state: not their first and last second, when the daemon meets
            # their processes and, holding the last reference to their RM clients' files, pays
            # for the driver's teardown of each one as it exits.
            time.sleep(max(start_at + CPU_EDGE_S - time.time(), 0))
            window_at = time.time()
            counts_before = turn_counts(daemon_info["status_path"])
            threads_before = threads_cpu_seconds(daemon_info["pid"])
            cpu_window = cpu_window_of(daemon_info["pid"], window)
            threads_after = threads_cpu_seconds(daemon_info["pid"])
            counts_after = turn_counts(daemon_info["status_path"])
        results = collect(processes, timeout=INIT_S + seconds + 30)
    out: dict[str, Any] = {"mode": mode, "n": n, "pods": results}
    # What the hypervisor took from the host while the pods ran (the GPU hosts are virtual
    # machines): on 2026-12-05 an H200 row's slow requests gathered where it did.
    out["host_steal"] = steal.within(start_at, start_at + seconds)
    if daemon_info is not None:
        out["daemon"] = {k: v for k, v in daemon_info.items() if k not in ("port", "status_path")}
        out["daemon"]["args"] = list(DAEMON_ARGS)
        if cpu_window is not None:
            out["daemon"]["cpu_window_s"] = window
            out["daemon"]["cpu_window_at"] = window_at
            # The daemon's own (user and system) and its guard's, all counted.
            out["daemon"]["cpu_percent_of_one_core"] = 100 * sum(cpu_window) / window
            out["daemon"]["cpu_user_percent"] = 100 * cpu_window[0] / window
            out["daemon"]["cpu_system_percent"] = 100 * cpu_window[1] / window
            out["daemon"]["cpu_children_percent"] = 100 * cpu_window[2] / window
            # Where the daemon's own CPU goes: its loop, its control worker (RM controls wait
            # for GSP in the kernel), its metrics server.
            out["daemon"]["cpu_threads_percent"] = threads_percent(
                threads_before, threads_after, window
            )
            # What its CPU paid for in the window: the hand-overs the pods saw (the GPU's
            # ground truth) and the daemon's own count of periods and turn ends.
            out["daemon"]["window_handovers_seen"] = handovers_seen(
                results, window_at, window_at + window
            )
            out["daemon"]["window_turns"] = counts_difference(counts_before, counts_after)
            # The period in force at the window's start and end: the turns' rotation, and so
            # the window fixed shares are judged over (whole_rotations()), follows from it.
            out["daemon"]["window_period_us"] = [
                None if counts is None else counts.get("period_us")
                for counts in (counts_before, counts_after)
            ]
    return out


def solo(n: int, seconds: float, cgroups: Cgroups) -> float:
    result = run_once(
        Scenario("solo", GpuPolicy.BEST_EFFORT, (Pod("solo", None),)), n, "native", seconds, cgroups
    )
    return float(result["pods"]["solo"]["it_per_s"])


def rate_between(
    result: dict[str, Any], start: float, end: float, sync_every: int = 8
) -> float | None:
    timeline = result.get("timeline")
    if not timeline:
        return None
    batches = sum(1 for t in timeline if start <= t < end)
    return batches * sync_every / (end - start)


def whole_rotations(
    scenario: Scenario, run: dict[str, Any], solos: dict[int, float]
) -> dict[str, Any] | None:
    """Each pod's share over the longest stretch of whole rotations of the daemon's turns that
    starts its CPU window (the pods' steady state), or None where there is none to judge: the
    daemon did not say its period (an older one), the period changed in the window, or the window
    is shorter than one rotation.

    The rm enforcer starts each period with the pod holding the GPU (SliceScheduler.apply), so
    the order of the offline pods' turns rotates and repeats every (offline pods) periods, and a
    pod's turns of two periods in a row run as one. Any window of a whole number of rotations
    holds each pod's planned share; a window cut elsewhere counts one turn more or less of
    somebody's: on an H200 (call 35B) the 8 s of fixed-share 50/30/20 gave b 0.272 (two whole
    0.72 s turns and two 0.36 s ones in 8 s), and the two whole 3.6 s rotations in it 0.302.
    """
    daemon = run.get("daemon") or {}
    periods = daemon.get("window_period_us") or []
    at, length = daemon.get("cpu_window_at"), daemon.get("cpu_window_s")
    if len(periods) != 2 or periods[0] is None or periods[0] != periods[1]:
        return None
    if at is None or not length:
        return None
    turn_taking = [p for p in scenario.pods if p.pod is None and p.pod_class is PodClass.OFFLINE]
    rotation_s = len(turn_taking) * periods[0] / 1e6
    count = int(length / rotation_s + 1e-9) if rotation_s > 0 else 0
    if count < 1:
        return None
    end = at + count * rotation_s
    shares = {}
    for pod in scenario.pods:
        result = run["pods"].get(pod.name, {})
        size = pod.n or run["n"]
        wall_start = result.get("wall_start")
        rate = None
        if wall_start is not None:
            rate = rate_between(result, at - wall_start, end - wall_start, pod.sync_every)
        if rate is None or size not in solos:
            return None
        shares[pod.name] = rate / solos[size]
    return {
        "rotation_s": rotation_s,
        "rotations": count,
        "shares": shares,
        "aggregate": sum(shares.values()),
    }


def is_online(scenario: Scenario) -> bool:
    return any(p.pod_class is PodClass.ONLINE for p in scenario.pods)


def online_pods(scenario: Scenario) -> list[Pod]:
    return [p for p in scenario.pods if p.pod_class is PodClass.ONLINE]


def own_solo(scenario: Scenario) -> bool:
    """Whether a row's online requests need a solo of their own, not SOLO_STREAM's: several
    streams (they wait behind each other without any trainer), or requests of another shape."""
    pods = online_pods(scenario)
    shape = ("n", "requests_hz", "request_kernels", "request_gap_ms")
    return len(pods) > 1 or any(
        getattr(p, field) != getattr(SOLO_STREAM, field) for p in pods for field in shape
    )


def _online_requests(scenario: Scenario, pods: dict[str, Any]) -> dict[str, Any]:
    """The online requests of a row: one stream's own results, or several streams' requests
    merged (every request counts once), or nothing if any stream reported nothing."""
    streams = [pods.get(p.name, {}) for p in online_pods(scenario)]
    if len(streams) == 1:
        return streams[0]
    if any(not s.get("latencies_ms") for s in streams):
        return {}
    latencies = [x for s in streams for x in s["latencies_ms"]]
    # Nearest rank, as each stream computes its own (tools/gpu/matmul.py).
    merged: dict[str, Any] = {
        "requests": len(latencies),
        **{f"p{name}_ms": percentile(latencies, q) for name, q in
           (("50", 0.50), ("90", 0.90), ("99", 0.99), ("999", 0.999))},
    }  # fmt: skip
    if all(s.get("runs_ms") for s in streams):
        runs = [x for s in streams for x in s["runs_ms"]]
        merged.update(run_p50_ms=percentile(runs, 0.50), run_p99_ms=percentile(runs, 0.99))
    return merged


def steal_share(steal: dict[str, Any] | None) -> float | None:
    """The share of a run's samples in which the hypervisor took CPU from the host; None where
    the run has none (reports from before 2026-12-05, or a run too short to sample)."""
    if not steal or not steal.get("samples"):
        return None
    return float(steal["with_steal"]) / float(steal["samples"])


def summarise(
    scenario: Scenario, run: dict[str, Any], solos: dict[int, float], seconds: float
) -> dict[str, Any]:
    pods = run["pods"]
    summary: dict[str, Any] = {}
    if is_online(scenario):
        online = _online_requests(scenario, pods)
        keys = ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "run_p50_ms", "run_p99_ms", "requests")
        for key in keys:
            summary[f"online_{key}"] = online.get(key)
        streams = online_pods(scenario)
        behind = [
            pods[p.name]["seconds"] - pods[p.name]["requests"] / p.requests_hz
            for p in streams
            if p.requests_hz and "seconds" in pods.get(p.name, {})
        ]
        if behind:
            # How late the slowest stream finished after its last request was due.
            summary["online_behind_s"] = round(max(behind), 3)
        if len(streams) > 1:
            summary["online_pods"] = {
                p.name: {k: pods.get(p.name, {}).get(k) for k in ("p50_ms", "p99_ms", "requests")}
                for p in streams
            }
        # Every offline pod, summed (the trainers of a scenario are of one size): missing if any
        # is missing, so that a crashed trainer never reads as a slower one.
        trainers = {
            p.name: pods.get(p.name, {}).get("it_per_s")
            for p in scenario.pods
            if p.pod_class is PodClass.OFFLINE
        }
        if len(trainers) > 1:
            summary["trainers_it_per_s"] = trainers
        rates = list(trainers.values())
        summary["trainer_it_per_s"] = None if None in rates else sum(rates)
        share = steal_share(run.get("host_steal"))
        if share is not None:
            summary["host_steal_pct"] = round(100 * share, 1)
        return summary
    shares = {}
    for pod in scenario.pods:
        result = pods.get(pod.name, {})
        size = pod.n or run["n"]
        if "it_per_s" in result and size in solos:
            shares[pod.name] = result["it_per_s"] / solos[size]
    summary["achieved_shares"] = shares
    summary["aggregate"] = sum(shares.values())
    if scenario.policy is GpuPolicy.FIXED_SHARE:
        rotations = whole_rotations(scenario, run, solos)
        if rotations is not None:
            summary["whole_rotations"] = rotations
    if any(p.late for p in scenario.pods):
        early = pods.get("a", {})
        size = run["n"]
        first = rate_between(early, 0.5, seconds / 2 - 0.1)
        second = rate_between(early, seconds / 2 + 0.5, seconds - 0.1)
        if first is not None and second is not None and size in solos:
            summary["a_share_while_b_idle"] = first / solos[size]
            summary["a_share_after_b_starts"] = second / solos[size]
            # Share of a in consecutive 50 ms windows around b's start: how fast it hands back.
            windows = []
            for k in range(-4, 12):
                start = seconds / 2 + k * 0.05
                rate = rate_between(early, start, start + 0.05)
                windows.append(None if rate is None else round(rate / solos[size], 3))
            summary["a_share_per_50ms_around_b_start"] = windows
    return summary


def resummarise(report: dict[str, Any]) -> dict[str, Any]:
    """An earlier run's report with each row summarised again from its pods' raw results: its
    table then follows today's summary (e.g. online_behind_s, which older reports lack)."""
    solos = {int(n): v for n, v in report.get("solo_it_per_s", {}).items()}
    by_name = {scenario.name: scenario for scenario in SCENARIOS}
    for name, rows in report.get("scenarios", {}).items():
        scenario = by_name.get(name)
        for row in rows:
            if scenario is not None and "pods" in row:
                row["summary"] = summarise(scenario, row, solos, report.get("seconds", 8.0))
    return report


def _brief(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pod.items() if k not in ("latencies_ms", "runs_ms", "timeline")}


def _shares(summary: dict[str, Any]) -> str:
    shares = summary.get("achieved_shares") or {}
    if not shares:
        return "-"
    text = " ".join(f"{pod} {value:.3f}" for pod, value in shares.items())
    return f"{text} (sum {summary.get('aggregate', 0):.3f})"


def _verdict(scenario: Scenario, summary: dict[str, Any], report: dict[str, Any], n: int) -> str:
    """The issue's target for this scenario, checked on the qpolicy run."""
    shares = summary.get("achieved_shares") or {}
    if is_online(scenario):
        return _online_verdict(scenario, summary, report)
    if scenario.name.startswith("daemon CPU"):
        return "see CPU column"
    if len(shares) != len(scenario.pods):
        return "incomplete"
    if scenario.policy is GpuPolicy.FIXED_SHARE:
        # Judged over whole rotations of the daemon's turns where the run has them; the whole
        # run's shares, cut anywhere in a rotation, are said beside (whole_rotations()).
        rotations = summary.get("whole_rotations")
        run_text, run_ok = _fixed_target(scenario, shares, summary["aggregate"])
        if rotations is None:
            return f"{run_text}: " + ("meets" if run_ok else "MISSES")
        text, ok = _fixed_target(scenario, rotations["shares"], rotations["aggregate"])
        return (
            f"over {rotations['rotations']} whole rotation(s) of {rotations['rotation_s']:g} s: "
            f"{text}: " + ("meets" if ok else "MISSES") + f" (the run's "
            f"{report.get('seconds', 8.0):g} s: {run_text})"
        )
    if scenario.policy is GpuPolicy.BURST_SHARE:
        windows = summary.get("a_share_per_50ms_around_b_start") or []
        after = windows[4:]
        handed = next((i for i, w in enumerate(after) if w is not None and w <= 0.6), None)
        idle = summary.get("a_share_while_b_idle") or 0.0
        ok = idle >= 0.9 and handed is not None and handed <= 1
        back = "never" if handed is None else f"{(handed + 1) * 50} ms"
        return f"a alone {idle:.2f}, handed back within {back}: " + ("meets" if ok else "MISSES")
    ok = summary["aggregate"] >= 0.95
    return f"sum {summary['aggregate']:.3f} (>= 0.95): " + ("meets" if ok else "MISSES")


def _fixed_target(
    scenario: Scenario, shares: dict[str, float], aggregate: float
) -> tuple[str, bool]:
    """Fixed-share's target on ``shares``, said and judged: a lone pod at most 2 points over
    its share; pods side by side each within 5 % of theirs, together at least 0.95 of the GPU."""
    if len(scenario.pods) == 1:
        pod = scenario.pods[0]
        assert pod.share is not None
        over = shares[pod.name] - pod.share / 100
        return f"{over * 100:+.1f} points (<= +2)", over <= 0.02
    errors = {p.name: shares[p.name] / ((p.share or 1) / 100) - 1 for p in scenario.pods}
    worst = max(errors.values(), key=abs)
    ok = abs(worst) <= 0.05 and aggregate >= 0.95
    return f"worst {worst:+.1%} (+-5%), sum >= 0.95", ok


def row_solo(scenario: Scenario, report: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The solo an online row is held against, and a note on which it is ("" for the usual).

    A row of several online pods, or of requests of another shape, has its own (main()). The
    others share the one-stream solo, measured before the rows and, since 2026-12-04, again after
    them: two of four H200 calls' first solo on a fresh machine was unstable and left the row
    unjudged (35C, 35G) where the same host's later solos were stable. Of the stable ones the
    row is held to the one with the lower p99, the stricter; where only the later one is
    stable, to it; where neither is, to the first, which the verdict reports as unstable
    (qpolicy/doctor/targets.py, stricter_solo(), the doctor's rule too)."""
    own = report.get("online_solo_of", {})
    if scenario.name in own:
        return own[scenario.name], ""
    before, after = report.get("online_solo", {}), report.get("online_solo_after")

    def measured(solo: dict[str, Any] | None) -> tuple[float, float] | None:
        if not solo or not solo.get("p50_ms") or not solo.get("p99_ms"):
            return None
        return solo["p50_ms"], solo["p99_ms"]

    first = measured(before)
    if stricter_solo([first, measured(after)]) != 1:
        return before, ""
    first_stable = first is not None and not solo_unstable(*first)
    why = "the lower p99 of two" if first_stable else "the one before was unstable"
    return after, f"the one after the rows ({why})"


def _ratio(ratio: float, unit: str, bound: float, met: bool) -> str:
    """A ratio to solo and its bound, with "missed" where it is over: to two places, or three
    where two would show the bound itself (call 42D's p99 was 1.501x solo, which read "1.50x
    (<=1.5)" though it missed)."""
    shown = f"{ratio:.2f}" if round(ratio, 2) != bound else f"{ratio:.3f}"
    return f"{shown}{unit} (<={bound:g}{'' if met else ': missed'})"


def _online_verdict(scenario: Scenario, summary: dict[str, Any], report: dict[str, Any]) -> str:
    """The online targets, judged as the doctor's promise judges them (qpolicy/doctor/targets.py):
    against solo (p99 <= 1.5x, p50 <= 1.2x, where solo is stable), the trainer against its
    co-located native throughput (>= 95 %, the 8192 trainer), and strictly better than native
    and MPS at p50 and p99. "meets" only where every target was checked: a row with an unstable
    solo, or without its native or MPS run, says which it could not judge."""
    own = scenario.name in report.get("online_solo_of", {})
    solo, which = row_solo(scenario, report)
    runs = {r["mode"]: r["summary"] for r in report["scenarios"].get(scenario.name, [])}
    p50, p99 = summary.get("online_p50_ms"), summary.get("online_p99_ms")
    if p50 is None or p99 is None or not solo.get("p50_ms"):
        return "incomplete"
    parts, ok, unjudged = [], True, []
    if own and len(online_pods(scenario)) > 1:
        parts.append(f"solo: the {len(online_pods(scenario))} online pods alone together")
    elif own:
        parts.append("solo: the same requests alone")
    if which:
        parts.append(f"solo: {which}")
    judged = against_solo(p50, p99, solo["p50_ms"], solo["p99_ms"])
    if judged is None:
        parts.append(
            f"solo unstable (p99 {solo['p99_ms']:.2f} > {UNSTABLE_SOLO:g}x p50 "
            f"{solo['p50_ms']:.2f}): not divided by"
        )
        unjudged.append("against solo")
    else:
        parts.append(
            f"p99 {_ratio(judged.p99_ratio, 'x solo', P99_BOUND, judged.p99_met)}, "
            f"p50 {_ratio(judged.p50_ratio, 'x', P50_BOUND, judged.p50_met)}"
        )
        ok &= judged.p99_met and judged.p50_met
    # Not a target: the p50's excess over solo's in time. The switch a request waits for cost
    # about as much on two H100 hosts whose solos differed, so the host that launched faster
    # showed the higher ratio for the same wait (calls 42D and 43B-E: 0.25 and 0.26-0.28 ms over
    # solo p50s of 0.39 and 0.27 ms, 1.6x and 1.95-2.05x).
    parts.append(f"p50 {p50 - solo['p50_ms']:.2f} ms over solo's")
    behind = summary.get("online_behind_s") or 0.0
    if behind > BEHIND_S:
        parts.append(f"online fell {behind:.1f} s behind its requests")
        ok = False
    if summary.get("host_steal_pct"):
        # Not a target: the host's CPUs taken by its hypervisor meanwhile (run_once()).
        parts.append(f"host steal in {summary['host_steal_pct']:g} % of its quarter seconds")
    run, solo_run = summary.get("online_run_p50_ms"), solo.get("run_p50_ms")
    if run and solo_run:
        # Not a target: how much of the p50 the run on the GPU took, which scheduling cannot
        # shorten (a run slower than solo's is the trainer's caches, clocks and memory traffic).
        parts.append(f"its run on the GPU p50 {run / solo_run:.2f}x solo's")
    native_trainer = (runs.get("native") or {}).get("trainer_it_per_s")
    trainer = summary.get("trainer_it_per_s")
    if trainer is None:
        # A trainer that crashed or hung reported nothing: no row meets without its trainers.
        parts.append("a trainer reported nothing")
        ok = False
    elif "8192" in scenario.name:
        native_behind = (runs.get("native") or {}).get("online_behind_s") or 0.0
        if native_trainer and native_behind > BEHIND_S:
            # Native served fewer requests in the trainer's run than were asked for: its trainer
            # kept time the online pod was owed, so it is no co-located baseline to hold to.
            parts.append(
                f"trainer {trainer / native_trainer:.0%} of native's, whose online stream fell "
                f"{native_behind:.1f} s behind"
            )
            unjudged.append("the trainer (native did not serve the requests)")
        elif native_trainer:
            keeps, kept = trainer_kept(trainer, native_trainer)
            parts.append(f"trainer {keeps:.0%} of native (>={TRAINER_FLOOR:.0%})")
            ok &= kept
        else:
            unjudged.append("the trainer (no native run)")
    for mode in ("native", "mps"):
        other = runs.get(mode)
        if other and other.get("online_p50_ms") and other.get("online_p99_ms"):
            better = better_than(p50, p99, other["online_p50_ms"], other["online_p99_ms"])
            parts.append(f"{'better' if better else 'NOT better'} than {mode}")
            ok &= better
        else:
            unjudged.append(f"against {'MPS' if mode == 'mps' else mode} (not run)")
    if not ok:
        return ", ".join(parts) + ": MISSES"
    if unjudged:
        return ", ".join(parts) + f": not judged {', '.join(unjudged)}; the rest holds"
    return ", ".join(parts) + ": meets"


def table(report: dict[str, Any]) -> list[str]:
    """Native, MPS and qpolicy side by side, with the target checked on qpolicy's run."""
    lines = [
        "| scenario | n | native | MPS | qpolicy | daemon CPU | target (qpolicy) |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        rows = report["scenarios"].get(scenario.name, [])
        for n in sorted({r["n"] for r in rows}):
            by_mode = {r["mode"]: r for r in rows if r["n"] == n}
            cells = []
            for mode in ("native", "mps", "qpolicy"):
                summary = by_mode.get(mode, {}).get("summary")
                if summary is None:
                    cells.append("-")
                elif is_online(scenario):
                    cells.append(
                        f"p50 {summary.get('online_p50_ms') or 0:.2f} / p90 "
                        f"{summary.get('online_p90_ms') or 0:.2f} / p99 "
                        f"{summary.get('online_p99_ms') or 0:.2f} / p99.9 "
                        f"{summary.get('online_p999_ms') or 0:.2f} ms "
                        f"({summary.get('online_requests') or 0}), trainer "
                        f"{summary.get('trainer_it_per_s') or 0:.0f} it/s"
                    )
                    if summary.get("online_run_p50_ms") is not None:
                        cells[-1] += f"; on the GPU p50 {summary['online_run_p50_ms']:.2f} ms"
                    if (summary.get("online_behind_s") or 0.0) > BEHIND_S:
                        cells[-1] += f"; fell {summary['online_behind_s']:.1f} s behind"
                else:
                    cells.append(_shares(summary))
            daemon = by_mode.get("qpolicy", {}).get("daemon", {})
            cpu = daemon.get("cpu_percent_of_one_core")
            cpu_cell = "-" if cpu is None else f"{cpu:.1f} %"
            if scenario.name.startswith("daemon CPU") and cpu is not None:
                cpu_cell += " (< 2): " + ("meets" if cpu < 2 else "MISSES")
                threads = daemon.get("cpu_threads_percent") or {}
                if threads:
                    cpu_cell += "; " + threads_text(threads)
                cpu_cell += turns_cell(daemon)
                floor = by_mode.get("probe", {}).get("daemon", {})
                if floor.get("cpu_percent_of_one_core") is not None:
                    cpu_cell += f"; probe only {floor['cpu_percent_of_one_core']:.2f} %"
                    threads = floor.get("cpu_threads_percent") or {}
                    if threads:
                        cpu_cell += f" ({threads_text(threads)})"
            summary = by_mode.get("qpolicy", {}).get("summary")
            verdict = "-" if summary is None else _verdict(scenario, summary, report, n)
            lines.append(f"| {scenario.name} | {n or '-'} | {' | '.join(cells)} | {cpu_cell} "
                         f"| {verdict} |")  # fmt: skip
    return lines


def threads_text(threads: dict[str, float]) -> str:
    """A daemon's CPU by thread, as the daemon CPU cell gives it: "main 1.10, qp-controls 0.43"."""
    return ", ".join(f"{name} {percent:.2f}" for name, percent in threads.items())


def turns_cell(daemon: dict[str, Any]) -> str:
    """What the daemon's CPU paid for in its CPU window, for the daemon CPU row: the hand-overs
    the pods saw, and the periods and turn ends the daemon counted in the same window.

    Counts over the daemon's life (its status at the end) are no measure of it: they include
    the pods' start and exit, when plans change every period (2026-12-02, call 26C: 41 periods
    and 320 turns in the daemon's 76 s; 149 hand-overs, nine a 4 s period, in the pods' 60).
    """
    cell = ""
    seen, window = daemon.get("window_handovers_seen"), daemon.get("cpu_window_s")
    if seen is not None and window:
        cell += f"; GPU handed over {seen} times ({seen / window:.2f}/s)"
    counts = daemon.get("window_turns")
    if isinstance(counts, dict):
        told = _listed(counts["turn_ends"])
        cell += (
            f"; turns ended: {told or 'none'}; periods {counts['periods']} "
            f"({counts['periods_stretched']} stretched)"
        )
        if counts.get("handle_writes") is not None:
            cell += f"; handle file written {counts['handle_writes']} times"
            why = counts.get("handle_writes_why")
            if why:
                cell += f" ({_listed(why)})"
            if counts.get("handle_unchanged") is not None:
                cell += f", left as it was {counts['handle_unchanged']} times"
        changes = counts.get("tracker_changes")
        if changes is not None:
            cell += f"; tracker changed: {_listed(changes) or 'never'}"
            by_cgroup = counts.get("tracker_changes_by_cgroup")
            if by_cgroup:
                cell += f" (in {_listed(by_cgroup)})"
    ids = daemon.get("cgroup_ids")
    if isinstance(ids, dict) and "by_id" in ids:
        how = "opened by id" if ids["by_id"] else "walked for"
        cell += f"; cgroup ids {how} ({ids.get('opened')} opened, {ids.get('walks')} walks)"
    return cell


def _listed(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {count}" for key, count in counts.items())


def _issued_late(solo: dict[str, Any]) -> str:
    """How many of an unstable solo's slow requests its host issued late (late_tails.py): in call
    42C's two unstable H100 solos nearly all were (68 of 75, 45 of 48), so the instability was
    the host's CPU, not the GPU. "" for a solo without matmul.py's late_ms (before 2bbd6de) or
    with none slow."""
    try:
        split = late_tails.tail("solo", "solo", solo, late_tails.SLOW_X)
    except late_tails.BadInput:
        return ""
    if not split.slow:
        return ""
    return f", {split.slow_issued_late} of its {split.slow} slow requests issued late by the host"


def solo_lines(report: dict[str, Any]) -> list[str]:
    """The one-stream online solos of the run, before and after the rows, with their stability."""
    lines = []
    for key, when in (("online_solo", "before the rows"), ("online_solo_after", "after them")):
        solo = report.get(key) or {}
        if solo.get("p50_ms") and solo.get("p99_ms"):
            unstable = solo_unstable(solo["p50_ms"], solo["p99_ms"])
            share = steal_share(report.get(f"{key}_host_steal"))
            steal = (
                "" if not share else f", host steal in {100 * share:.1f} % of its quarter seconds"
            )
            lines.append(
                f"online solo {when}: p50 {solo['p50_ms']:.2f} / p99 {solo['p99_ms']:.2f} ms "
                f"({solo.get('requests') or 0}){', unstable' if unstable else ''}{steal}"
                f"{_issued_late(solo) if unstable else ''}"
            )
    return ["", *lines] if lines else []


def other_modes(report: dict[str, Any]) -> list[str]:
    """The online rows' runs in modes beside native, MPS and qpolicy (the uncapped MPS modes,
    the probe), each against the row's solo."""
    lines = []
    for scenario in SCENARIOS:
        if not is_online(scenario):
            continue
        solo, _ = row_solo(scenario, report)
        for run in report["scenarios"].get(scenario.name, []):
            summary = run.get("summary") or {}
            p50, p99 = summary.get("online_p50_ms"), summary.get("online_p99_ms")
            if run["mode"] in ("native", "mps", "qpolicy") or p50 is None or p99 is None:
                continue
            against = ""
            if solo.get("p50_ms") and solo.get("p99_ms"):
                against = f"{p50 / solo['p50_ms']:.2f} / {p99 / solo['p99_ms']:.2f}"
            trainer = summary.get("trainer_it_per_s")
            lines.append(
                f"| {scenario.name} | {run['mode']} | p50 {p50:.2f} / p90 "
                f"{summary.get('online_p90_ms') or 0:.2f} / p99 {p99:.2f} / p99.9 "
                f"{summary.get('online_p999_ms') or 0:.2f} ms "
                f"({summary.get('online_requests') or 0}) | {against or '-'} | "
                f"{'-' if trainer is None else f'{trainer:.0f} it/s'} |"
            )
    if not lines:
        return []
    head = [
        "",
        "| scenario | mode | online | p50 / p99 x solo | trainer |",
        "|---|---|---|---|---|",
    ]
    return head + lines


def annotation_lines(report: dict[str, Any]) -> list[str]:
    """How each qpolicy-annotated run's daemon learnt of its pods: the seconds from the last
    annotation written to its status listing them all, and whether it watched the hierarchy
    (inotify) or walked it."""
    lines = []
    for name, runs in report.get("scenarios", {}).items():
        for run in runs:
            if run.get("mode") != "qpolicy-annotated":
                continue
            daemon = run.get("daemon") or {}
            after = daemon.get("annotations_listed_after_s")
            listed = "not listed in time" if after is None else f"listed after {after:.2f} s"
            if "annotations_dropped_after_s" in daemon:
                gone = daemon["annotations_dropped_after_s"]
                listed += (
                    ", still listed once they were taken off"
                    if gone is None
                    else f", dropped {gone:.2f} s after they were taken off"
                )
            watch = daemon.get("annotations") or {}
            if "watched_directories" in watch:
                how = f"watched ({watch['watched_directories']} directories)"
            elif "walked" in watch:
                how = f"walked: {watch['walked']}"
            else:
                how = "the daemon did not say"
            lines.append(f"- {name}, n={run.get('n')}: pods by annotations {listed}, {how}")
    return ["", *lines] if lines else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-results/gpu.json")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--daemon-seconds",
        type=float,
        default=32.0,
        help="length of the daemon CPU runs: a 30 s window (0.03 points of a core at the "
        "kernel's 100 Hz CPU clock) with two scrapes in it",
    )
    parser.add_argument(
        "--online-seconds",
        type=float,
        default=20.0,
        help=f"length of each online run ({ONLINE_HZ:g} requests/s)",
    )
    parser.add_argument("--sizes", default="2048,4096,8192")
    parser.add_argument(
        "--modes",
        default="native,mps,qpolicy",
        help="also, for online rows, 'probe' (the daemon's probe attached, nothing enforced) "
        "the uncapped MPS modes (" + ", ".join(m for m in MPS_MODES if m != "mps") + "), "
        "qpolicy-pod-mps, and qpolicy-annotated (the pods told by cgroup annotations)",
    )
    parser.add_argument("--only", action="append", default=None, help="scenario name prefix")
    parser.add_argument(
        "--daemon-logs", action="store_true", help="keep each daemon's debug log next to --out"
    )
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for every qpolicy daemon, e.g. --daemon-arg=--min-turn-ms=400",
    )
    parser.add_argument(
        "--online-timed",
        action="store_true",
        help="time each online request's run on the GPU with a CUDA event before and after its "
        "matmul: the split between the wait and the run, but the events are work submitted "
        "apart from the matmul, a gap the GPU can switch away in (the 2048 rows' tail, "
        "BENCHMARKS.md 2026-11-26): not the default",
    )
    parser.add_argument(
        "--online-plain",
        action="store_true",
        help="each online request its matmul alone (the default; kept for the commands of "
        "2026-11-26)",
    )
    parser.add_argument(
        "--profile-daemon",
        action="store_true",
        help="run each daemon under cProfile; its profile is kept next to --out",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=None,
        help="the online strategy of every qpolicy daemon: 'default' the engine's timeslices, a "
        "lever a doctor cache recommending it (forced, whatever the doctor would pick); by "
        "default the node's doctor cache, as in production",
    )
    parser.add_argument(
        "--table", metavar="JSON", help="print the table of an earlier run's JSON and exit"
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the names of the scenarios --only chooses, one a line, and exit",
    )
    parser.add_argument(
        "--solo-from", metavar="JSON", help="reuse the solo throughputs of an earlier run"
    )
    args = parser.parse_args()
    DAEMON_ARGS.extend(args.daemon_arg)
    STRATEGY.extend([args.strategy] if args.strategy else [])
    if args.online_timed and args.online_plain:
        parser.error("--online-timed and --online-plain exclude each other")
    ONLINE_ARGS.extend(online_args(args.online_timed))
    if args.table:
        earlier = resummarise(json.loads(Path(args.table).read_text()))
        print(
            "\n".join(
                table(earlier)
                + solo_lines(earlier)
                + other_modes(earlier)
                + annotation_lines(earlier)
            )
        )
        return 0
    if args.list:
        print(
            "\n".join(
                s.name
                for s in SCENARIOS
                if not args.only or any(s.name.startswith(p) for p in args.only)
            )
        )
        return 0
    sizes = [int(x) for x in args.sizes.split(",")]
    modes = args.modes.split(",")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cgroups = Cgroups()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "seconds": args.seconds,
        "online_plain": not args.online_timed,
        "strategy": args.strategy or "the node's doctor cache",
        "solo_it_per_s": {},
        "scenarios": {},
    }
    chosen = [
        scenario
        for scenario in SCENARIOS
        if not args.only or any(scenario.name.startswith(p) for p in args.only)
    ]
    try:
        if args.solo_from:
            earlier = json.loads(Path(args.solo_from).read_text())
            report["solo_it_per_s"] = {int(n): v for n, v in earlier["solo_it_per_s"].items()}
            report["solo_from"] = f"{args.solo_from} ({earlier['date']})"
        for n in sorted(set(sizes) - set(report["solo_it_per_s"])):
            report["solo_it_per_s"][n] = solo(n, args.seconds, cgroups)
            print(f"solo n={n}: {report['solo_it_per_s'][n]:.1f} it/s", flush=True)
        if any(is_online(s) and not own_solo(s) for s in chosen):
            online_solo = run_once(
                Scenario(
                    "online solo",
                    GpuPolicy.BEST_EFFORT,
                    (SOLO_STREAM,),
                ),
                0,
                "native",
                args.online_seconds,
                cgroups,
            )
            report["online_solo"] = online_solo["pods"]["online"]
            report["online_solo_host_steal"] = online_solo.get("host_steal")
            print(json.dumps({"online solo": _brief(report["online_solo"])}), flush=True)
        for scenario in chosen:
            if own_solo(scenario):
                # Several streams start together at one rate: their requests arrive together
                # and one waits behind the other whatever the trainer does. Their solo is
                # therefore all of them without the trainer, not one stream alone; requests of
                # another shape are held against themselves alone.
                alone = Scenario(
                    f"{scenario.name}: the online pods alone",
                    GpuPolicy.BEST_EFFORT,
                    tuple(dataclasses.replace(p, share=None) for p in online_pods(scenario)),
                )
                together = run_once(alone, 0, "native", args.online_seconds, cgroups)
                merged = _online_requests(alone, together["pods"])
                report.setdefault("online_solo_of", {})[scenario.name] = {
                    **merged,
                    "pods": {k: _brief(v) for k, v in together["pods"].items()},
                }
                print(json.dumps({alone.name: _brief(merged)}), flush=True)
        for scenario in chosen:
            rows = report["scenarios"].setdefault(scenario.name, [])
            for n in scenario.sizes if scenario.sizes != (0,) else (0,):
                if n and n not in sizes:
                    continue
                extra = [
                    "probe",
                    "qpolicy-pod-mps",
                    "qpolicy-annotated",
                    *MPS_MODES.keys() - {"mps"},
                ]
                if scenario.name.startswith("daemon CPU"):
                    # The same pods watched by a daemon that enforces nothing: the probe's
                    # share of the daemon's CPU, the floor under what the enforcer adds.
                    extra = ["probe"]
                elif not is_online(scenario):
                    extra = []
                for mode in [*scenario.modes, *extra]:
                    if mode not in modes:
                        continue
                    keep_log = profile = None
                    slug = "".join(c if c.isalnum() else "-" for c in scenario.name)
                    if args.daemon_logs and mode in (
                        "qpolicy",
                        "qpolicy-pod-mps",
                        "qpolicy-annotated",
                    ):
                        which = "" if mode == "qpolicy" else f"-{mode}"
                        keep_log = out.parent / f"daemon-{slug}-{n}{which}.log"
                    if args.profile_daemon and mode == "qpolicy":
                        profile = out.parent / f"daemon-{slug}-{n}.prof"
                    seconds = args.seconds
                    if is_online(scenario):
                        seconds = args.online_seconds
                    elif scenario.name.startswith("daemon CPU"):
                        seconds = args.daemon_seconds
                    run = run_once(scenario, n, mode, seconds, cgroups, keep_log, profile)
                    run["summary"] = summarise(scenario, run, report["solo_it_per_s"], args.seconds)
                    rows.append(run)
                    print(
                        json.dumps(
                            {"scenario": scenario.name, "n": n, "mode": mode, **run["summary"]}
                        ),
                        flush=True,
                    )
                    out.write_text(json.dumps(report, indent=1))
        if "online_solo" in report:
            # The solo again, after the rows: the host may have been unsettled for the first
            # (row_solo()), or may have drifted over the run, which the two side by side show.
            after = run_once(
                Scenario("online solo after", GpuPolicy.BEST_EFFORT, (SOLO_STREAM,)),
                0,
                "native",
                args.online_seconds,
                cgroups,
            )
            report["online_solo_after"] = after["pods"]["online"]
            report["online_solo_after_host_steal"] = after.get("host_steal")
            print(
                json.dumps({"online solo after": _brief(report["online_solo_after"])}), flush=True
            )
    finally:
        cgroups.clean()
        out.write_text(json.dumps(report, indent=1))
    print(
        "\n".join(
            table(report) + solo_lines(report) + other_modes(report) + annotation_lines(report)
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
