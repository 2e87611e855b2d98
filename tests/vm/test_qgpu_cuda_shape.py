"""qgpu against processes shaped like CUDA: gpuload --tree cuda builds the H200 trace's object
tree (4 TSGs and 20 channels a process, USERD and rings in a video memory object the process
owns, CUDA's own SET_TIMESLICE and CILP request), and qgpu's shares, online preemption and memory
limit must hold as they do for gpuload's one-channel tree (tests/vm/test_qgpu_slices.py,
tests/vm/test_qgpu_gates.py). Ground truth is nvmock's engine and qgpu's counters."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest

from qpolicy.enforcers.kmod.client import CgroupStats, QgpuClient
from qpolicy.nvrm.abi import NvStatus
from tests.vm.gpuload import start_together
from tests.vm.nvmock import kernel_log, reset
from tests.vm.qgpu_env import (
    Cgroup,
    burst_hand_back,
    cgroups,
    gpu_shares,
    in_cgroup,
    native_then_online,
    qgpu_loaded,
    side_by_side,
    stats_of,
)

CUDA = ["--tree", "cuda"]
SATURATE = [*CUDA, "--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]
REQUEST = [
    *CUDA,
    "--shape",
    "requests",
    "--rate-hz",
    "50",
    "--kernel-us",
    "2000",
    "--poll-us",
    "20",
]
PERIOD_US = 50_000
MIB = 1 << 20
USERD_MEMORY_MIB = 2  # the video memory --tree cuda allocates for rings and USERD


def test_fixed_shares_hold_for_cuda_shaped_processes() -> None:
    with qgpu_loaded() as client, cgroups(3) as cgs:
        reports, shares = gpu_shares(
            client, cgs, (50, 30, 20), [*SATURATE, "--seconds", "6"], PERIOD_US
        )
        assert all(report["tree"] == "cuda" and report["kernels"] > 0 for report in reports)
        print("cuda-shaped fixed-share 50/30/20 ->", [round(s, 2) for s in shares])
        for got, want in zip(shares, (50, 30, 20), strict=True):
            assert got == pytest.approx(want, abs=2)
        throttled = {s.cgroup_id: s.nr_throttled for s in client.cgroups()}
        assert all(throttled[cg.id] > 0 for cg in cgs)


def test_burst_share_lends_and_takes_back_for_cuda_shaped_processes() -> None:
    """Burst-share 30/70 as in tests/vm/test_qgpu_slices.py, with processes of CUDA's tree: A
    alone gets the engine B leaves idle, and from one period after B has work the split is
    30:70 again. A process of this tree runs its kernels on one of its 20 channels; the other
    19, idle, must not hold its cgroup's turns."""
    with qgpu_loaded() as client, cgroups(2) as cgs:
        lent, a_share, firsts = burst_hand_back(client, cgs, SATURATE, PERIOD_US)
        first = statistics.mean(firsts)
        print(f"cuda-shaped burst-share: A alone {lent:.3f}, next to B {a_share:.3f} (first 0.5 s"
              f" {', '.join(f'{f:.3f}' for f in firsts)}: mean {first:.3f})")  # fmt: skip
        assert lent > 0.8
        assert a_share == pytest.approx(0.30, abs=0.03)
        # A hand-back a period late would add about 0.07 to the mean.
        assert first == pytest.approx(0.30, abs=0.05)


def _side_by_side(online: Cgroup, offline: Cgroup) -> tuple[dict[str, Any], float]:
    return side_by_side(
        online, offline, [*REQUEST, "--seconds", "6"], [*SATURATE, "--seconds", "6"]
    )


def log_lines() -> int:
    return len(kernel_log().splitlines())


def qgpu_said(since: int) -> str:
    """qgpu's and nvmock's kernel log lines after the first ``since``: shown with a failed
    assertion. CI failed two of these tests once each in a mode the runs here never showed (the
    offline pod at 0.665-0.667 of the GPU against 0.76-0.78 natively, the online p50 5.75 ms
    where it is 3.3-3.6), at b220651 and 2d92f4e; twelve runs at 2d92f4e passed."""
    lines = kernel_log().splitlines()[since:]
    lines = [line for line in lines if "qgpu" in line or "nvmock" in line]
    return " | ".join(lines)[-3000:] or "nothing logged"


def _native_then_online(
    client: QgpuClient, online: Cgroup, offline: Cgroup
) -> tuple[dict[str, Any], float, dict[str, Any], float]:
    # 1 000 requests at 50 a second: the p99 is held below native's, and over the 300 of 6 s it
    # was their third-slowest, one stall of the host's away (fresh-clone CI at e8641d8: 9.37
    # against native's 7.38 ms, its p50 3.08 against 6.10).
    return native_then_online(
        client, online, offline, [*REQUEST, "--seconds", "20"], [*SATURATE, "--seconds", "20"],
        PERIOD_US,
    )  # fmt: skip


@pytest.mark.parametrize("gate", [0, 1])
def test_an_online_cuda_shaped_process_preempts_an_offline_one(gate: int) -> None:
    """The offline pod is one CUDA context, its TSGs at the class's 1 us timeslice (online 8192
    us: timeslice.c), so the GPU switches to online work by itself, better than native
    time-slicing, and qgpu closes no offline channel for it: not under its default
    (online_gate=0, the timeslices alone), nor under 1, which leaves a pod the GPU preempts
    open. The pod may be closed only as it starts (0: waiting for its first turn, 3 periods,
    2.6 ms in one run; 1: until its timeslice is set): under 60 ms of throttled time, where
    closing it for every request (online_gate=2) would come to seconds of the 20 s (50
    requests a second, each over 2 ms).

    Both percentiles are checked against native's in a VM of one vCPU (the Makefile's
    VM_TIMED); `make bench-vm` holds the p99 to solo's over 1 001 requests. p50 / p99: native
    5.63 / 6.96 and 5.55 / 7.79 ms, qgpu 2.63 / 3.19 and 2.67 / 3.11 at 0 and 1 (2026-12-04). In a
    VM of two vCPUs, whose p99 of 300 requests was its stalls (solo's 3-4 x its p50), only the p50
    was checked: native 7.5-8.3 ms, qgpu's 3.6-4.6 ms in eight runs (solo 3.1-3.5 ms)."""
    since = log_lines()
    with qgpu_loaded(online_gate=gate) as client, cgroups(2) as (online, offline):
        native, native_offline, gated, gated_offline = _native_then_online(client, online, offline)
        print(
            f"online_gate={gate}: cuda-shaped online p50/p99 native {native['p50_ms']:.2f}/"
            f"{native['p99_ms']:.2f} ms, qgpu {gated['p50_ms']:.2f}/{gated['p99_ms']:.2f} ms;"
            f" offline share {native_offline:.3f} -> {gated_offline:.3f}"
        )
        stats = {s.cgroup_id: s for s in client.cgroups()}
        why = f"offline {stats[offline.id]}; online {stats[online.id]}; log: {qgpu_said(since)}"
        assert gated["requests"] > 0 and gated_offline > 0, why
        assert gated["p50_ms"] < 0.75 * native["p50_ms"], why
        assert gated["p99_ms"] < native["p99_ms"], why
        assert stats[offline.id].throttled_ns < 60_000_000, why
        assert stats[online.id].nr_throttled == 0, why
        assert gated_offline >= 0.95 * native_offline, why


def _requests_beside_two_trainers(
    online: Cgroup, offline: Cgroup, client: QgpuClient | None = None
) -> tuple[dict[str, Any], CgroupStats | None]:
    """Online requests next to two saturating processes of one offline pod: the online
    report, and (given ``client``) the offline pod's stats halfway through."""
    reset()
    infer, *trains = start_together(
        [*REQUEST, "--seconds", "6"], [*SATURATE, "--seconds", "6"], [*SATURATE, "--seconds", "6"],
        cgroups=[str(online.path), str(offline.path), str(offline.path)],
    )  # fmt: skip
    time.sleep(3)
    during = stats_of(client, offline) if client else None
    served = infer.result()
    for train in trains:
        train.result()
    return served, during


def test_an_offline_pod_of_two_processes_is_closed_for_online_work() -> None:
    """Two trainers in one offline pod keep their own timeslices (given the class's 1 us they
    would switch against each other at every slice: timeslice.c), so the GPU does not make way
    for online work by itself: with online_gate=1 qgpu closes the pod while online work runs,
    and the online p50 comes down from native time-slicing's. (Not the default: on an H100 and
    an H200 such closing cost the trainer 6-19 % and, next to short kernels, made online
    latency worse than native's; BENCHMARKS.md, 2026-11-27.)"""
    with qgpu_loaded(online_gate=1) as client, cgroups(2) as (online, offline):
        native, _ = _requests_beside_two_trainers(online, offline)
        client.set_gpu(0, "best-effort", PERIOD_US)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        gated, during = _requests_beside_two_trainers(online, offline, client)
        assert during is not None
        print(
            f"two offline processes: online p50/p99 native {native['p50_ms']:.2f}/"
            f"{native['p99_ms']:.2f} ms, qgpu {gated['p50_ms']:.2f}/{gated['p99_ms']:.2f} ms;"
            f" offline throttled {during.throttled_ns / 1e6:.0f} ms in {during.nr_throttled}"
            " periods by 3 s"
        )
        assert during.own_timeslices and not during.timeslice_preempted
        assert during.nr_throttled > 0 and during.throttled_ns > 60_000_000
        assert gated["requests"] > 0 and gated["p50_ms"] < 0.75 * native["p50_ms"]
        assert stats_of(client, online).nr_throttled == 0


def test_offline_keeps_what_an_online_cuda_shaped_process_leaves() -> None:
    """As for gpuload's own tree (tests/vm/test_qgpu_slices.py): the online pod asks for about a
    tenth of the GPU, and the offline pod must keep at least 95 % of its native share.

    With CUDA's 2048 us timeslice the trainer keeps more of the GPU natively than gpuload's own
    tree does, so the margin is smaller, and one 6 s run of each side varies by a few percent on
    the VM (its vCPUs stall). Native and qgpu runs alternate, twice each, and their sums are
    compared: the same target, measured with half the variance of one pair."""
    native_offline = gated_offline = 0.0
    since = log_lines()
    seen: list[str] = []
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_gpu(0, "best-effort", PERIOD_US)
        for _ in range(2):
            native_offline += _side_by_side(online, offline)[1]
            client.set_cgroup(online.id, 0, "online", 50)
            client.set_cgroup(offline.id, 0, "offline", 50)
            share = _side_by_side(online, offline)[1]
            gated_offline += share
            seen.append(f"{share:.3f}: {stats_of(client, offline)}")
            client.del_cgroup(online.id)
            client.del_cgroup(offline.id)
        print(
            f"cuda-shaped offline share, two runs each: native {native_offline / 2:.3f},"
            f" qgpu {gated_offline / 2:.3f}"
        )
        assert gated_offline >= 0.95 * native_offline, f"{seen}; log: {qgpu_said(since)}"


def test_the_memory_limit_counts_cudas_userd_memory_and_holds() -> None:
    """The limit is 64 MiB; the process's own 2 MiB of ring and USERD memory count against it,
    so 62 MiB more fit exactly and 63 do not."""
    limit_mib = 64
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=limit_mib * MIB)
        fits = limit_mib - USERD_MEMORY_MIB
        ok = in_cgroup(cg, [*CUDA, "--seconds", "0.2", "--vidmem-mib-hold", str(fits)])
        assert ok.ready().result()["vidmem_status"] == f"0x{NvStatus.NV_OK:x}"
        over = in_cgroup(cg, [*CUDA, "--seconds", "0.2", "--vidmem-mib-hold", str(fits + 1)])
        report = over.ready().result()
        assert report["vidmem_status"] == f"0x{NvStatus.NV_ERR_NO_MEMORY:x}"
        stats = stats_of(client, cg)
        assert stats.oom == 1 and stats.mem_used == 0
