"""qgpu.ko's numbers in the VM, against nvmock alone (native time-slicing) in the same run.

Run by ``make bench-vm`` (through tools/vm/run); writes build/vm/bench-qgpu.json.

1. Hook overhead per ioctl: rounds alternate unhooked and hooked runs of tools/bench/ioctlbench
   so that the VM's drift falls on both; the hooked runs are from a process in a container
   cgroup below a pod cgroup that qgpu gates (the full path: cgroup hierarchy lookup, tracker,
   guard). With QGPU_BASELINE (a qgpu.ko built from an older commit by
   tools/bench/qgpu_baseline.sh; ``make bench-vm`` builds BASELINE=20a672a) each round also
   runs hooked by that module, so both costs come from the same run. With QGPU_BEFORE (``make
   bench-vm BEFORE=rev``: a recent commit's qgpu.ko, which follows the cgroup hierarchy) each
   round also runs hooked by that one, gated as the current module is: a change's before and
   after from the same run.
   Then RM_FREE's cost in a client shaped as libcuda's (tools/bench/free_sweep.py): after a
   free that may have destroyed TSGs or channels as its dependents, qgpu asks RM about each of
   the client's; unhooked, hooked, and hooked by QGPU_BEFORE's module, rounds alternating.
   BENCH_ONLY=hook stops after this part; BENCH_ONLY=frees runs its RM_FREE costs alone;
   BENCH_ONLY=online skips it and part 2's shares (the online-offline scenario alone, REPEAT
   times, to see how much it moves between runs); BENCH_ONLY=userd runs part 3 alone.
2. The kmod issue's targets on nvmock's engine (ground truth: its debugfs): fixed-share 50/30/20,
   a lone fixed-share pod, burst-share hand-back, and online requests next to an offline
   trainer, native and gated, between two solos of the same 1 001 requests (solo_of()); each
   with gpuload's own object tree and with CUDA's.
3. USERD reads a scheduler pass makes with CUDA-shaped pods on the GPU (idle online pods beside
   a busy offline trainer), every channel read at every pass (cold_look_us=0, as before
   2026-12-05) and cold channels read every cold_look_us (the default), in the same run; and
   what those reads would cost a host's CPU at the per-read cost measured on an H100 and an H200.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from qpolicy.doctor.targets import P99_BOUND, stricter_solo  # noqa: E402
from qpolicy.enforcers.kmod.client import QgpuClient  # noqa: E402
from qpolicy.telemetry.cgroups import cgroup_id  # noqa: E402
from tests.vm.gpuload import start_together  # noqa: E402
from tests.vm.nvmock import engine_account, load, make_nodes, read_nvmock_param, reset  # noqa: E402
from tests.vm.qgpu_env import (  # noqa: E402
    COLD_AFTER_S,
    COLD_LOOK,
    DORMANT_LOOK,
    cgroups,
    ensure_cgroup2,
    gpu_seconds,
    in_cgroup,
    sched_counts,
)
from tools.bench import vm_stalls  # noqa: E402

BENCH = ROOT / "tools" / "bench" / "ioctlbench" / "ioctlbench"
QGPU = ROOT / "kmod" / "qgpu" / "qgpu.ko"
CGROUP = Path("/sys/fs/cgroup/qgpu-bench")
# Where the benchmark runs: a container below the configured pod cgroup (the Kubernetes shape;
# a qgpu.ko from before the cgroup hierarchy was followed would not see it as gated, so the
# baseline gates the container itself).
CONTAINER = CGROUP / "ctr"
BASELINE = Path(os.environ["QGPU_BASELINE"]) if os.environ.get("QGPU_BASELINE") else None
BASELINE_REV = os.environ.get("QGPU_BASELINE_REV", "baseline")
BEFORE = Path(os.environ["QGPU_BEFORE"]) if os.environ.get("QGPU_BEFORE") else None
BEFORE_REV = os.environ.get("QGPU_BEFORE_REV", "before")
ONLY = os.environ.get("BENCH_ONLY", "")
OUT = ROOT / "build" / "vm" / "bench-qgpu.json"
ROUNDS = int(os.environ.get("ROUNDS", "5"))
ITERATIONS = os.environ.get("ITERATIONS", "20000")
KEYS = ("control_ns", "alloc_free_ns", "sysparams_ns")
FREE_PAIRS = os.environ.get("FREE_PAIRS", "300")
PERIOD_US = 50_000
SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]
# --timeline: each request's latency and completion time are kept in the result, as `make
# bench-gpu` keeps its requests': where a tail comes from is read from them afterwards.
REQUEST = ["--shape", "requests", "--rate-hz", "50", "--kernel-us", "2000", "--poll-us", "20"]
REQUEST += ["--timeline"]
# 1 001 requests a run: a p99 needs 1 000 (until 2026-12-04 the runs were 8 s, 400 requests,
# whose p99 was their fourth-worst).
ONLINE_SECONDS = 20
# Each scenario runs with gpuload's own tree (one TSG, one channel) and with CUDA's (the H200
# trace's: 4 TSGs and 20 channels a process, USERD in video memory; tools/gpuload/CUDA_SEQUENCE.md).
TREES = {"gpuload tree": [], "CUDA tree": ["--tree", "cuda"]}
# qgpu's online_hold_us, busy_hold_us, online_gate, cold_look_us and dormant_look_us for the
# whole run; unset keeps the module's default.
QGPU_PARAMS = {
    name: int(os.environ[name.upper()])
    for name in (
        "online_hold_us",
        "busy_hold_us",
        "online_gate",
        "cold_look_us",
        "dormant_look_us",
    )
    if name.upper() in os.environ
}
REPEAT = int(os.environ.get("REPEAT", "1"))
# nvmock's GSP controls' durations for the run, in percent of an H200's, if not its default
# (100; kmod/nvmock/control.c); 0 answers them at once.
GSP_PCT = os.environ.get("GSP_PCT")


def run_in(in_cgroup: bool, command: list[str]) -> dict[str, Any]:
    """``command``'s JSON output, run in the container cgroup or not."""

    def enter() -> None:
        if in_cgroup:
            (CONTAINER / "cgroup.procs").write_text(str(os.getpid()))

    out = subprocess.run(
        command, capture_output=True, text=True, check=True, preexec_fn=enter, cwd=ROOT
    )
    return dict(json.loads(out.stdout))


def run_bench(in_cgroup: bool) -> dict[str, Any]:
    return run_in(in_cgroup, [str(BENCH), ITERATIONS])


def run_frees(in_cgroup: bool) -> dict[str, Any]:
    return run_in(in_cgroup, [sys.executable, "-m", "tools.bench.free_sweep", FREE_PAIRS])


def hooked_by(
    module: Path, gated: Path, run: Callable[[bool], dict[str, Any]] = run_bench
) -> dict[str, Any]:
    """One run of ``run`` with ``module`` loaded and the cgroup ``gated`` configured."""
    subprocess.run(["insmod", str(module), "target=nvmock"], check=True)
    try:
        with QgpuClient.open() as client:
            client.set_cgroup(cgroup_id(gated), 0, "offline", 100)
            result = run(True)
            client.del_cgroup(cgroup_id(gated))
    finally:
        subprocess.run(["rmmod", "qgpu"], check=True)
    return result


def hook_overhead() -> dict[str, object]:
    CONTAINER.mkdir(parents=True, exist_ok=True)
    plain: list[dict[str, float]] = []
    hooked: list[dict[str, float]] = []
    baseline: list[dict[str, float]] = []
    before: list[dict[str, float]] = []
    run_bench(False)  # warm up
    for _ in range(ROUNDS):
        plain.append(run_bench(False))
        hooked.append(hooked_by(QGPU, CGROUP))
        if BASELINE is not None:
            baseline.append(hooked_by(BASELINE, CONTAINER))
        if BEFORE is not None:
            before.append(hooked_by(BEFORE, CGROUP))
    CONTAINER.rmdir()
    CGROUP.rmdir()
    result: dict[str, object] = {"rounds": ROUNDS, "iterations": int(ITERATIONS)}
    if BASELINE is not None:
        result["baseline"] = BASELINE_REV
    if BEFORE is not None:
        result["before"] = BEFORE_REV
    head = f"{'ioctl':<12} {'nvmock ns':>10} {'hooked ns':>10} {'ratio':>6}"
    if BASELINE is not None:
        head += f" {BASELINE_REV + ' ns':>12} {'ratio':>6}"
    if BEFORE is not None:
        head += f" {BEFORE_REV + ' ns':>12} {'ratio':>6}"
    print(head)
    for key in KEYS:
        a = statistics.median(r[key] for r in plain)
        b = statistics.median(r[key] for r in hooked)
        row: dict[str, float] = {"unhooked_ns": a, "hooked_ns": b, "ratio": b / a}
        line = f"{key.removesuffix('_ns'):<12} {a:>10.0f} {b:>10.0f} {b / a:>6.2f}"
        if BASELINE is not None:
            c = statistics.median(r[key] for r in baseline)
            row.update({"baseline_hooked_ns": c, "baseline_ratio": c / a})
            line += f" {c:>12.0f} {c / a:>6.2f}"
        if BEFORE is not None:
            d = statistics.median(r[key] for r in before)
            row.update({"before_hooked_ns": d, "before_ratio": d / a})
            line += f" {d:>12.0f} {d / a:>6.2f}"
        result[key] = row
        print(line)
    return result


def free_costs() -> dict[str, Any]:
    """RM_FREE in a client shaped as libcuda's (free_sweep.py): unhooked, hooked by this
    qgpu.ko and, with QGPU_BEFORE, by that one, rounds alternating; the medians of ns and of
    kernel controls (qgpu's questions to RM) a pair of RM_ALLOC + RM_FREE."""
    CONTAINER.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {"nvmock": [], "hooked": []}
    if BEFORE is not None:
        runs[BEFORE_REV] = []
    run_frees(False)  # warm up
    for _ in range(ROUNDS):
        runs["nvmock"].append(run_frees(False))
        runs["hooked"].append(hooked_by(QGPU, CGROUP, run_frees))
        if BEFORE is not None:
            runs[BEFORE_REV].append(hooked_by(BEFORE, CGROUP, run_frees))
    CONTAINER.rmdir()
    CGROUP.rmdir()
    first = runs["nvmock"][0]
    result: dict[str, Any] = {
        "rounds": ROUNDS,
        "pairs": first["pairs"],
        "tsgs": first["tsgs"],
        "channels": first["channels"],
    }
    print(
        f"RM_ALLOC + RM_FREE in a client of {first['tsgs']} TSGs and {first['channels']}"
        f" channels (libcuda's), {first['pairs']} pairs a run, medians of {ROUNDS} runs:"
    )
    print(f"  {'freed':<8} " + " ".join(f"{name + ' us':>12} {'controls':>8}" for name in runs))
    for freed in ("sysmem", "vaspace"):
        row: dict[str, Any] = {}
        line = f"  {freed:<8} "
        for name, results in runs.items():
            us = statistics.median(r[freed]["ns"] for r in results) / 1000
            controls = statistics.median(r[freed]["kernel_controls"] for r in results)
            row[name] = {"us": us, "kernel_controls": controls}
            line += f" {us:>12.1f} {controls:>8.2f}"
        result[freed] = row
        print(line)
    return result


def shares(
    client: QgpuClient, policy: str, wanted: tuple[int, ...], tree: list[str]
) -> list[float]:
    with cgroups(len(wanted)) as cgs:
        client.set_gpu(0, policy, PERIOD_US)
        for cg, share in zip(cgs, wanted, strict=True):
            client.set_cgroup(cg.id, 0, "offline", share)
        reset()
        loads = start_together(
            *([*tree, *SATURATE, "--seconds", "8"] for _ in cgs),
            cgroups=[str(c.path) for c in cgs],
        )
        walls = [load.result()["elapsed_s"] for load in loads]
        seconds = [gpu_seconds(load.pid) for load in loads]
        for cg in cgs:
            client.del_cgroup(cg.id)
    if len(wanted) == 1:
        return [seconds[0] / walls[0] * 100]
    return [s / sum(seconds) * 100 for s in seconds]


def _latency(report: dict[str, Any]) -> dict[str, Any]:
    """A request stream's p50 and p99, ms, how many requests they are of, and each request's
    latency (ms) and completion (s into the run) where gpuload reported them."""
    out = {"p50_ms": report["p50_ms"], "p99_ms": report["p99_ms"], "requests": report["requests"]}
    if "latencies_ms" in report:
        out["latencies_ms"] = report["latencies_ms"]
        out["done_s"] = report["timeline"]
    return out


def solo_of(before: dict[str, Any], after: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The solo the online pod is held against, and which it is: the one
    qpolicy/doctor/targets.py's stricter_solo() picks (the GPU bench's rule: of the stable ones,
    the lower p99); where neither is stable, the first, whose p99 is then not divided by
    (its p50 still is: such solos' p50s differed by up to 7 %, their p99s by up to half).

    Why two: in a VM of two vCPUs (TCG on 2 cores) two solos of 1 001 requests in one run read
    p99 8.7 and 13.0 ms, p50 2.55 and 2.72 (2026-12-04); before that the bench took one solo of
    400. In the bench's VM of one vCPU (since 2026-12-04) its solos are stable (p99 1.09-1.37 x
    p50), and both are still measured: a solo can be disturbed there too."""
    chosen = stricter_solo([(s["p50_ms"], s["p99_ms"]) for s in (before, after)])
    if chosen is None:
        return before, "neither stable"
    return ((before, "before"), (after, "after"))[chosen]


def online_offline(client: QgpuClient, tree: list[str]) -> dict[str, Any]:
    """Online requests next to an offline trainer, native and gated, between two solos of the
    same requests."""
    out: dict[str, Any] = {}
    request = [*tree, *REQUEST, "--seconds", str(ONLINE_SECONDS)]
    with cgroups(2) as (online, offline):
        before = _latency(in_cgroup(online, request).ready().result())
        reset()
        alone = in_cgroup(offline, [*tree, *SATURATE, "--seconds", "5"]).ready()
        alone_wall = alone.result()["elapsed_s"]
        out["offline_solo_share"] = gpu_seconds(alone.pid) / alone_wall
        for mode in ("native", "qgpu"):
            if mode == "qgpu":
                client.set_gpu(0, "best-effort", PERIOD_US)
                client.set_cgroup(online.id, 0, "online", 50)
                client.set_cgroup(offline.id, 0, "offline", 50)
            reset()
            infer, train = start_together(
                request,
                [*tree, *SATURATE, "--seconds", str(ONLINE_SECONDS)],
                cgroups=[str(online.path), str(offline.path)],
            )
            served = infer.result()
            wall = train.result()["elapsed_s"]
            # The engine's own account of its switches: time no one ran in.
            engine = engine_account()
            out[f"{mode}_switches"] = engine["switches"]
            out[f"{mode}_switch_s"] = engine["switch_ns"] / 1e9
            online_share = gpu_seconds(infer.pid) / wall
            offline_share = gpu_seconds(train.pid) / wall
            out[f"{mode}_online"] = _latency(served)
            out[f"{mode}_online_p99_ms"] = served["p99_ms"]
            out[f"{mode}_offline_share"] = offline_share
            # What online leaves, at the efficiency the offline pod reaches alone in this VM.
            out[f"{mode}_offline_kept"] = offline_share / (
                (1 - online_share) * out["offline_solo_share"]
            )
        client.del_cgroup(online.id)
        client.del_cgroup(offline.id)
        client.set_gpu(0, "best-effort")
        after = _latency(in_cgroup(online, request).ready().result())
    solo, which = solo_of(before, after)
    out.update(solo_before=before, solo_after=after, solo_used=which)
    out["online_solo_p99_ms"] = solo["p99_ms"]
    for mode in ("native", "qgpu"):
        # None where no solo was stable: a ratio to a stall is no measure (the GPU bench's rule).
        stable = which != "neither stable"
        out[f"{mode}_p99_ratio"] = out[f"{mode}_online_p99_ms"] / solo["p99_ms"] if stable else None
        out[f"{mode}_p50_ratio"] = out[f"{mode}_online"]["p50_ms"] / solo["p50_ms"]
    q, n = out["qgpu_online"], out["native_online"]
    out["qgpu_better_than_native"] = q["p50_ms"] < n["p50_ms"] and q["p99_ms"] < n["p99_ms"]
    return out


# What one uncached 64-bit load of USERD in BAR1 costs the CPU on a real GPU host: 1.03-1.20 us,
# from a CUDA process's own watcher on an H100 and an H200 (tools/gpu/userd_fetch.py, raw
# tools/gpu/results/2026-11-2[67]-userd-fetch-*.json.xz: loads over the span of the run's events,
# so a lower bound; BENCHMARKS.md, 2026-12-05). qgpu reads through an uncached ioremap of the
# same memory; its own reads are not measured on a GPU (the hosts load only signed modules).
USERD_READ_US = 1.1
IDLE_PODS = int(os.environ.get("IDLE_PODS", "3"))
# An idle pod: one request at the start, the next after the window (a request stream whose
# rate put its second past --seconds would end after the first).
IDLE = ["--tree", "cuda", "--shape", "requests", "--rate-hz", "0.15", "--seconds", "8"]
# The window opens this long after the pods are ready, once their channels have gone cold. Their
# first requests start up to start_together()'s 1.5 s later, so each pod's request channel may
# still be warm for the window's first second: one channel in 20.
SETTLE_S = COLD_AFTER_S + 0.5
WINDOW_S = 3.0


def userd_reads(client: QgpuClient) -> dict[str, Any]:
    """USERD reads per pass and per second with IDLE_PODS idle online CUDA pods beside a busy
    offline CUDA trainer, in the same run: every channel read at every pass (as before
    2026-12-05), cold ones every cold_look_us (dormant_look_us=0, as from then to 2026-12-05's
    thirty-ninth session), and dormant ones every dormant_look_us too (the run's settings)."""
    cold_default, dormant_default = int(COLD_LOOK.read_text()), int(DORMANT_LOOK.read_text())
    out: dict[str, Any] = {"idle_pods": IDLE_PODS, "channels_a_pod": 20, "read_us": USERD_READ_US}
    settings = (
        ("every_pass", 0, 0),
        ("cold_looks", cold_default, 0),
        ("dormant_looks", cold_default, dormant_default),
    )
    for name, cold, dormant in settings:
        COLD_LOOK.write_text(str(cold))
        DORMANT_LOOK.write_text(str(dormant))
        with cgroups(IDLE_PODS + 1) as (*online, offline):
            client.set_gpu(0, "best-effort", PERIOD_US)
            for cg in online:
                client.set_cgroup(cg.id, 0, "online", 50)
            client.set_cgroup(offline.id, 0, "offline", 50)
            loads = start_together(
                *(IDLE for _ in online),
                [*TREES["CUDA tree"], *SATURATE, "--seconds", "8"],
                cgroups=[str(c.path) for c in (*online, offline)],
            )
            time.sleep(SETTLE_S)
            passes, reads = sched_counts()
            started = time.monotonic()
            time.sleep(WINDOW_S)
            elapsed = time.monotonic() - started
            after = sched_counts()
            for load in loads:
                load.result()
            for cg in (*online, offline):
                client.del_cgroup(cg.id)
        n_passes, n_reads = after[0] - passes, after[1] - reads
        out[name] = {
            "cold_look_us": cold,
            "dormant_look_us": dormant,
            "passes": n_passes,
            "reads": n_reads,
            "seconds": elapsed,
            "reads_a_pass": n_reads / n_passes,
            "reads_a_second": n_reads / elapsed,
            # A host at the default poll_us passes every 250 us; the VM (TCG) passes less often,
            # so more of the cold looks, which are timed, fall in each of its passes: for cold
            # looks this overstates a host's cost.
            "host_cpu_pct_at_poll_us": n_reads / n_passes * USERD_READ_US / 250 * 100,
        }
    COLD_LOOK.write_text(str(cold_default))
    DORMANT_LOOK.write_text(str(dormant_default))
    client.set_gpu(0, "best-effort")
    return out


def print_userd(u: dict[str, Any]) -> None:
    print(f"USERD reads, {u['idle_pods']} idle online CUDA pods beside a busy offline trainer:")
    for name in ("every_pass", "cold_looks", "dormant_looks"):
        r = u[name]
        print(
            f"  cold_look_us={r['cold_look_us']:<5} dormant_look_us={r['dormant_look_us']:<6}"
            f" -> {r['reads_a_pass']:.2f} reads a pass,"
            f" {r['reads_a_second']:.0f} a second ({r['passes']} passes in {r['seconds']:.1f} s);"
            f" at {u['read_us']} us a read and a pass each 250 us, a host would spend"
            f" {r['host_cpu_pct_at_poll_us']:.1f} % of a core reading, under qgpu's lock"
        )


def _ratio(value: float | None) -> str:
    return "not divided by" if value is None else f"{value:.2f}x"


# The kmod issue's online targets: qgpu's online p99 within P99_BOUND x solo's (the GPU issue's
# bound too), and the offline pod keeping this much of what online work leaves it.
OFFLINE_KEPT_FLOOR = 0.90


def kmod_verdict(oo: dict[str, Any]) -> str:
    """qgpu's run held to the kmod issue's online targets, each met, missed, or not judged (no
    stable solo)."""
    ratio, kept = oo["qgpu_p99_ratio"], oo["qgpu_offline_kept"]
    if ratio is None:
        p99 = f"p99 <= {P99_BOUND}x solo: not judged (no stable solo)"
    else:
        p99 = (
            f"p99 <= {P99_BOUND}x solo: {'met' if ratio <= P99_BOUND else 'MISSED'} ({ratio:.2f}x)"
        )
    floor = "met" if kept >= OFFLINE_KEPT_FLOOR else "MISSED"
    return f"{p99}; offline kept >= {OFFLINE_KEPT_FLOOR}: {floor} ({kept:.3f})"


def print_online(oo: dict[str, Any]) -> None:
    b, a = oo["solo_before"], oo["solo_after"]
    print(
        f"  online solo, p50/p99 ms ({b['requests']} requests) -> before {b['p50_ms']:.2f}/"
        f"{b['p99_ms']:.2f}, after {a['p50_ms']:.2f}/{a['p99_ms']:.2f}; held to: {oo['solo_used']}"
    )
    for mode in ("native", "qgpu"):
        lat = oo[f"{mode}_online"]
        print(
            f"  online {mode:<6} p50/p99 -> {lat['p50_ms']:.2f}/{lat['p99_ms']:.2f} ms: p99"
            f" {_ratio(oo[f'{mode}_p99_ratio'])} solo, p50 {oo[f'{mode}_p50_ratio']:.2f}x"
        )
    print(f"  qgpu better than native at p50 and p99 -> {oo['qgpu_better_than_native']}")
    print(f"  kmod issue's targets -> {kmod_verdict(oo)}")
    print(
        "  offline kept of what online leaves -> native {native_offline_kept:.3f},"
        " qgpu {qgpu_offline_kept:.3f}".format(**oo)
    )
    print(
        "  engine switches      -> native {native_switches} in {native_switch_s:.3f} s,"
        " qgpu {qgpu_switches} in {qgpu_switch_s:.3f} s".format(**oo)
    )


def load_nvmock(**params: int) -> None:
    """nvmock loaded for one GPU with ``params``, its device nodes made, cgroup v2 and debugfs
    mounted: the VM as the benches need it."""
    if not Path("/sys/kernel/debug/tracing").exists():
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
    load(num_gpus=1, **params)
    make_nodes(gpus=1)
    ensure_cgroup2()


def main() -> int:
    load_nvmock(**({} if GSP_PCT is None else {"gsp_pct": int(GSP_PCT)}))
    result: dict[str, object] = {}
    if ONLY in ("", "hook"):
        result["hook"] = hook_overhead()
    if ONLY in ("", "hook", "frees"):
        result["frees"] = free_costs()
    result["nvmock_gsp_pct"] = read_nvmock_param("gsp_pct")
    # The VM's size is part of the result: a lone online stream's p99 was 3.9-4.9 x its p50
    # with two vCPUs on this machine's two cores and 1.09-1.37 x with one (`make bench-vm`'s).
    result["vcpus"] = os.cpu_count()
    print(f"VM of {result['vcpus']} vCPU(s)")
    if ONLY in ("hook", "frees"):
        subprocess.run(["rmmod", "nvmock"], check=True)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    params = ["target=nvmock"]
    for name, value in QGPU_PARAMS.items():
        params.append(f"{name}={value}")
        result[name] = value
    subprocess.run(["insmod", str(QGPU), *params], check=True)
    trees = {} if ONLY == "userd" else TREES
    if trees:
        # Before any workload, in the idle VM: how often the VM itself stops (vm_stalls.py).
        result["vm_stalls"] = vm_stalls.measure()
        print(vm_stalls.describe(result["vm_stalls"]))
    with QgpuClient.open() as client:
        for name, tree in trees.items():
            if ONLY == "online":
                runs = [online_offline(client, tree) for _ in range(REPEAT)]
                client.set_gpu(0, "best-effort")
                result[name] = {"online_offline": runs}
                print(f"{name}:")
                for oo in runs:
                    print_online(oo)
                continue
            fs = shares(client, "fixed-share", (50, 30, 20), tree)
            lone = shares(client, "fixed-share", (30,), tree)
            bs = shares(client, "burst-share", (30, 70), tree)
            oo = online_offline(client, tree)
            client.set_gpu(0, "best-effort")
            result[name] = {
                "fixed_share_50_30_20": fs,
                "lone_fixed_share_30": lone,
                "burst_share_30_70": bs,
                "online_offline": oo,
            }
            print(f"{name}:")
            print(f"  fixed-share 50/30/20 -> {fs[0]:.1f}/{fs[1]:.1f}/{fs[2]:.1f}")
            print(f"  lone fixed-share 30  -> {lone[0]:.1f} % of wall time")
            print(f"  burst-share 30/70    -> {bs[0]:.1f}/{bs[1]:.1f}")
            print_online(oo)
        if ONLY != "online":
            userd = userd_reads(client)
            result["userd_reads"] = userd
            print_userd(userd)
    subprocess.run(["rmmod", "qgpu"], check=True)
    subprocess.run(["rmmod", "nvmock"], check=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
