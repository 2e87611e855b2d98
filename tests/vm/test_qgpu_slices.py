"""qgpu's time slices on nvmock's engine; ground truth is the engine's GPU time per process.

The VM runs without KVM, so wall-clock numbers are noisy; every share is measured over whole
seconds of saturating work and compared with the targets of the kmod issue.
"""

from __future__ import annotations

import functools
import statistics
import time

import pytest

from tests.vm.conftest import HOST_TIMED
from tests.vm.gpuload import Gpuload, start_together
from tests.vm.nvmock import nvmock_param, reset
from tests.vm.qgpu_env import (
    burst_hand_back,
    cgroups,
    gpu_seconds,
    gpu_shares,
    in_cgroup,
    native_then_online,
    qgpu_loaded,
)

SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]
PERIOD_US = 50_000

# Every test here measures shares or latencies of the emulated GPU: one rerun each (HOST_TIMED),
# in a VM of one vCPU (the Makefile's VM_TIMED). CI's runs in a VM of two failed five of them once
# each (e249b79, a24da00, 5b3f5d0): a burst-share pod at 0.270 for 0.30 +- 0.03, an online p99 of
# 32.6 ms for at most twice solo's 14.6 (300 requests, whose p99 was the two vCPUs' stalls), each
# passing here and in other CI runs.
pytestmark = HOST_TIMED


def test_fixed_share_50_30_20_within_two_points() -> None:
    with qgpu_loaded() as client, cgroups(3) as cgs:
        _, shares = gpu_shares(client, cgs, (50, 30, 20), [*SATURATE, "--seconds", "6"], PERIOD_US)
        print("fixed-share 50/30/20 ->", [round(s, 2) for s in shares])
        for got, want in zip(shares, (50, 30, 20), strict=True):
            assert got == pytest.approx(want, abs=2)
        throttled = {s.cgroup_id: s.nr_throttled for s in client.cgroups()}
        assert all(throttled[cg.id] > 0 for cg in cgs)


@functools.cache
def switch_shares() -> tuple[float, ...]:
    """Fixed-share 50/30/20 with nvmock's context switch at 3 ms, measured once for the two
    tests below. The grace that bounds the wait for a turn's start (start_grace_us, 2 ms) is
    raised past the VM's 3 ms switch."""
    with (
        nvmock_param("switch_us", 3000),
        qgpu_loaded(start_grace_us=10_000) as client,
        cgroups(3) as cgs,
    ):
        _, shares = gpu_shares(client, cgs, (50, 30, 20), [*SATURATE, "--seconds", "6"], PERIOD_US)
    print("fixed-share 50/30/20 with 3 ms switches ->", [round(s, 2) for s in shares])
    return tuple(shares)


def measured_switch_shares(request: pytest.FixtureRequest) -> tuple[float, ...]:
    """switch_shares(), measured afresh for a rerun (HOST_TIMED): its rerun would otherwise be
    handed the measurement that failed. CI's run at a24da00 measured 52.35/29.82/17.83, where five
    runs here gave 50.47-51.78 / 29.20-30.22 / 18.90-19.70."""
    if getattr(request.node, "execution_count", 1) > 1:
        switch_shares.cache_clear()
    return switch_shares()


def test_the_switch_to_a_turn_is_charged_to_no_slice(request: pytest.FixtureRequest) -> None:
    """Every turn begins with a context switch that no one's work runs in. Charged to the pod
    whose turn it is, a fixed cost per turn comes off small shares more than large ones: with
    3 ms a switch and 25/15/10 ms slices, 50/30/20 came out 52.7/29.7/17.6 with the grace at 0.
    qgpu starts a slice when the pod's work is seen on the GPU (sched.c): no pod gets less than
    its share by more than 2 points."""
    for got, want in zip(measured_switch_shares(request), (50, 30, 20), strict=True):
        assert got >= want - 2


def test_no_pod_gets_more_than_its_share_when_switches_overfill_the_period(
    request: pytest.FixtureRequest,
) -> None:
    """With 3 ms switches the three turns (50 ms of slices, 9 ms of switches) overfill the 50 ms
    period. A refill at the period's end cut a waiting pod's slice to the carry and gave a whole
    new one to the pod whose turn it was, so the turns' order decided the split: the 30 % pod
    came out up to 3.3 points over its share (6 of 17 runs over 2 at 0db02e0 to bc44cc1). Under
    fixed-share the refill now waits until every busy pod has had its slice (sched.c)."""
    for got, want in zip(measured_switch_shares(request), (50, 30, 20), strict=True):
        assert got <= want + 2


def test_a_lone_fixed_share_pod_stays_within_its_share() -> None:
    """The share is a ceiling on the engine's own count. The floor says the gate opens for the
    pod's slice: it is taken against what the same load keeps busy alone in the same run, since
    a pod whose CPU side is slowed (two cores shared by the guest's vCPUs and QEMU) leaves part
    of its own slice unused. A fixed floor of 22.5 % failed on busy hosts (CI at b220651: 19.8 %
    twice), where a quiet one reads 26.0-26.2 % of wall time and 0.97-0.98 alone (so 0.89-0.91
    of 30 % of what it can use)."""
    load_args = [*SATURATE, "--seconds", "5"]
    reset()
    alone = engine_use_alone(load_args)
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_gpu(0, "fixed-share", PERIOD_US)
        client.set_cgroup(cg.id, 0, "offline", 30)
        reset()
        load = in_cgroup(cg, load_args).ready()
        result = load.result()
        fraction = gpu_seconds(load.pid) / result["elapsed_s"] * 100
        print(f"lone fixed-share 30 -> {fraction:.2f} (alone {alone:.3f} of the engine: "
              f"{fraction / (30 * alone):.3f} of its share of that)")  # fmt: skip
        assert fraction <= 30 + 1
        assert fraction >= 0.75 * 30 * alone


def lone_share(gsp_pct: int) -> float:
    """The % of wall time nvmock's engine gave a lone fixed-share 30 pod, its GSP controls
    taking ``gsp_pct`` % of an H200's."""
    with nvmock_param("gsp_pct", gsp_pct), qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_gpu(0, "fixed-share", PERIOD_US)
        client.set_cgroup(cg.id, 0, "offline", 30)
        reset()
        load = in_cgroup(cg, [*SATURATE, "--seconds", "5"]).ready()
        wall = load.result()["elapsed_s"]
        return gpu_seconds(load.pid) / wall * 100


def test_a_lone_fixed_share_pod_is_not_charged_for_the_gsps_waits() -> None:
    """The slice runs while the pod can run: from when RM answered its open, not from when the
    pass decided on it, and not through the GR reads after its close. At 10 x an H200's control
    times (an open 3.7 ms, a GR read 2.9 ms), 30 % of a 50 ms period came out 14.3-16.4 % of
    wall time before (28.5-28.8 % with controls answered at once, the same runs), 27.9-28.5 %
    after (2026-12-04). Held against the same load at once in the same test, as a busy host
    slows both."""
    at_once = lone_share(0)
    slow = lone_share(1000)
    print(f"lone fixed-share 30: {at_once:.2f} % with controls at once, {slow:.2f} % at 10 x")
    assert 20 <= at_once <= 30 + 1
    assert slow <= 30 + 1
    assert slow >= 0.9 * at_once


# A loop that waits for each result: a request per kernel, issued as soon as the last is done.
SYNCED = ["--shape", "requests", "--rate-hz", "5000", "--kernel-us", "1000", "--poll-us", "20"]


def beside_a_trainer(
    args: list[str], gsp_pct: int, policy: str = "fixed-share", online: bool = False
) -> tuple[float, float, float, bool]:
    """A gpuload run of ``args`` alone, then beside a saturating pod, each in a cgroup of its own
    under ``policy`` 50/50, with nvmock's GSP controls taking ``gsp_pct`` % of an H200's (and, if
    ``online``, an online cgroup configured on the GPU, with nothing in it: the offline pods'
    TSGs then hold qgpu's short offline timeslice). The part of the engine it kept busy alone,
    the parts it and the saturating pod used side by side, and whether qgpu took its pod to be
    preempted by the GPU itself (every TSG at the offline timeslice) halfway through."""
    reset()
    alone = engine_use_alone([*args, "--seconds", "4"])
    with (
        nvmock_param("gsp_pct", gsp_pct),
        qgpu_loaded() as client,
        cgroups(3 if online else 2) as cgs,
    ):
        client.set_gpu(0, policy, PERIOD_US)
        for cg in cgs[:2]:
            client.set_cgroup(cg.id, 0, "offline", 50)
        if online:
            client.set_cgroup(cgs[2].id, 0, "online", 50)
        reset()
        train, loop = start_together(
            [*SATURATE, "--seconds", "6"],
            [*args, "--seconds", "6"],
            cgroups=[str(c.path) for c in cgs[:2]],
        )
        time.sleep(3)
        preempted = {s.cgroup_id: s.timeslice_preempted for s in client.cgroups()}[cgs[1].id]
        wall = loop.result()["elapsed_s"]
        train.result()
        return alone, gpu_seconds(loop.pid) / wall, gpu_seconds(train.pid) / wall, preempted


# GSP's controls answered at once, and as long as on an H200 (FIFO_DISABLE_CHANNELS 0.48 ms a
# close, nvmock's control.c): work the GPU fetches between qgpu's look and the close still runs,
# then is taken off the engine.
@pytest.mark.parametrize("gsp_pct", [0, 100])
def test_a_pod_that_waits_for_each_result_keeps_its_fixed_share(gsp_pct: int) -> None:
    """Such a loop shows GP_PUT != GP_GET only between a launch and its fetch (on an H100, 0.3 %
    of the time with 1.6 ms matmuls: tools/gpu/userd_fetch.py), so qgpu sees its work from its
    GP_GET moving (sense() in sched.c): counted idle, its turns ended early and went to the
    saturating pod beside it. Fixed-share 50/50: it uses about its half of the wall time, at the
    efficiency it reaches alone (its CPU time between kernels is its own loss)."""
    alone, used, _, _ = beside_a_trainer(SYNCED, gsp_pct)
    kept = used / (0.5 * alone)
    print(f"synced loop, GSP at {gsp_pct} %: alone {alone:.3f} of the engine, "
          f"in its half {used:.3f}: kept {kept:.2f}")  # fmt: skip
    assert kept > 0.8


def test_a_pod_whose_kernels_outlast_its_turns_keeps_its_fixed_share() -> None:
    """Kernels of 40 ms, waited for one by one, beside a saturating pod, fixed-share 50/50 in
    50 ms periods: no turn (25 ms) holds a whole kernel, and after its fetch a kernel shows
    nothing in USERD (tools/gpu/userd_fetch.py), so each is taken off unfinished and the pod
    reads idle. Owed for owed_ms (20 ms) of open time, it then has its share only from what the
    other pod cannot use (owed_idle() in sched.c); before that it hung once its kernel had had
    the owed time."""
    long_kernels = ["--shape", "requests", "--rate-hz", "1000", "--kernel-us", "40000"]
    alone, used, trained, _ = beside_a_trainer([*long_kernels, "--poll-us", "20"], 100)
    kept = used / (0.5 * alone)
    print(f"40 ms kernels: alone {alone:.3f}, in its half {used:.3f} (kept {kept:.2f}), "
          f"the other pod {trained:.3f}")  # fmt: skip
    assert kept > 0.8
    # Fixed-share caps both: neither has more than its half (two points of the engine's time).
    assert used <= 0.52
    assert trained <= 0.52


@pytest.mark.parametrize(
    ("policy", "online"), [("burst-share", False), ("best-effort", False), ("burst-share", True)]
)
def test_kernels_that_outlast_owed_ms_are_not_starved_beside_work_that_never_pauses(
    policy: str, online: bool
) -> None:
    """The 40 ms kernels above, 50/50 under a policy that lends idle time, beside a pod that
    never pauses: a kernel taken off unfinished reads idle, and past owed_ms its pod was no
    longer counted busy, so the other pod's work kept it closed for good (before owed_again()
    in sched.c the loop's first kernel never ended: gpuload gave up after 30 s). Now it is owed
    owed_ms of open time again now and then: beside the holder where its TSGs keep their own
    timeslice (1, 2, 4 ... periods after it passed owed_ms), in a turn of its own where they
    hold qgpu's short offline one (4, 8, 16 ... periods after; an online cgroup is configured:
    two TSGs with work at 1 us would switch at every slice and neither run). Each kernel then
    ended within a few periods, but the pod kept only 0.09-0.20 of the engine (0.94-0.98 alone)
    in 13 runs of either kind, for what a kernel runs after its fetch was seen by no one; the
    trainer 0.64-0.83. Now each close that takes one of its kernels off mid-work (GR saves its
    context by CILP, read around the close: probe_close() in sched.c) makes it owed in full
    again, and it keeps most of its half: 0.39-0.41 (the trainer 0.43-0.48) in the first run
    of each kind."""
    long_kernels = ["--shape", "requests", "--rate-hz", "1000", "--kernel-us", "40000"]
    args = [*long_kernels, "--poll-us", "20"]
    alone, used, trained, preempted = beside_a_trainer(args, 100, policy, online)
    print(f"{policy}{' with an online cgroup' if online else ''}, 40 ms kernels: alone "
          f"{alone:.3f}, beside the trainer {used:.3f}, the trainer {trained:.3f}")  # fmt: skip
    assert preempted == online
    # Most of its half: before owed_again(), not one kernel in 6 s; before the saves were read
    # around its closes, 0.09-0.20.
    assert used > 0.3 * alone
    assert trained > 0.38
    # The owed time is spent on the taken-off kernels, not left idle.
    assert used + trained > 0.8


@pytest.mark.parametrize("online", [False, True])
def test_a_quiet_pod_costs_a_saturating_one_little_under_burst_share(online: bool) -> None:
    """A pod with a 1 ms request twice a second beside a saturating pod, burst-share 50/50:
    after each request it is owed (its work was fetched in its turn), and past owed_ms it is
    owed again now and then (owed_again() in sched.c). Opened beside the saturating pod, with
    nothing to run, it costs it nothing more: that pod kept 0.90-0.93 of what it runs alone in
    five runs, 0.921 before owed_again(). Where an online cgroup is configured it gets turns of
    its own, each leaving the GPU idle for owed_ms: 4, 8, 16 ... periods apart they left
    0.85-0.87 (three runs), 1, 2, 4 ... periods apart (a draft of the change) 0.781. Since
    closes are read for saves (a10f5ce), three runs each here: 0.873-0.931, and 0.829-0.926
    with an online cgroup; in CI once 0.745, with the host starving the VM (HOST_TIMED)."""
    quiet = ["--shape", "requests", "--rate-hz", "2", "--kernel-us", "1000", "--poll-us", "20"]
    trainer_alone = engine_use_alone([*SATURATE, "--seconds", "4"])
    _, used, trained, _ = beside_a_trainer(quiet, 100, "burst-share", online)
    with_online = " with an online cgroup" if online else ""
    print(f"quiet pod beside a saturating one, burst-share{with_online}: {used:.4f} of the "
          f"engine; the other {trained:.3f} (alone {trainer_alone:.3f})")  # fmt: skip
    assert trained > (0.82 if online else 0.87) * trainer_alone


def test_a_pod_leaving_its_slice_unused_hands_it_back_within_the_period() -> None:
    """Burst-share 10/90, a pod with a 1 ms request ten times a second beside a saturating pod:
    a request waits for a period boundary and gets 90 % of that period, of which it uses its
    kernel and owed_ms. What it leaves goes to the saturating pod within the same period, the
    period's time split again among the busy ones (work conserving, as burst-share promises),
    not left idle until the next refill. The saturating pod kept 0.685 of what it runs alone
    (one run in a VM of one vCPU); with that time left idle, 0.535."""
    quiet = ["--shape", "requests", "--rate-hz", "10", "--kernel-us", "1000", "--poll-us", "20"]
    trainer_alone = engine_use_alone([*SATURATE, "--seconds", "4"])
    with qgpu_loaded() as client, cgroups(2) as cgs:
        client.set_gpu(0, "burst-share", PERIOD_US)
        for cg, share in zip(cgs, (10, 90), strict=True):
            client.set_cgroup(cg.id, 0, "offline", share)
        reset()
        train, pod = start_together(
            [*SATURATE, "--seconds", "6"],
            [*quiet, "--seconds", "6"],
            cgroups=[str(c.path) for c in cgs],
        )
        wall = train.result()["elapsed_s"]
        requests = pod.result()["requests"]
        trained = gpu_seconds(train.pid) / wall
    print(f"{requests} requests of a 90 % pod beside a saturating 10 % one, burst-share: it "
          f"kept {trained:.3f} (alone {trainer_alone:.3f})")  # fmt: skip
    assert trained > 0.61 * trainer_alone


def test_best_effort_splits_equally_whatever_the_shares() -> None:
    """Best-effort gives every busy offline pod an equal part of the period: the shares given
    with it (80 and 20 here) are for burst-share and fixed-share, and an operator switching a GPU
    to best-effort expects them to weigh nothing."""
    with qgpu_loaded() as client, cgroups(2) as cgs:
        _, pcts = gpu_shares(
            client, cgs, (80, 20), [*SATURATE, "--seconds", "4"], PERIOD_US, "best-effort"
        )
    print(f"best-effort with shares 80/20: {pcts[0]:.2f}/{pcts[1]:.2f}")
    assert pcts[0] == pytest.approx(50, abs=5)


def test_a_quiet_pod_is_not_counted_as_throttled() -> None:
    """A pod with a 1 ms request twice a second, beside a saturating pod, fixed-share 50/50:
    after each request its turn ends with its work fetched, so it is owed, and past owed_ms it
    counts as busy only for time the other pod cannot use (owed_idle() in sched.c). Whether it
    has work then is unknown, so a closed pass of it is not throttling: it is throttled in about
    the periods its requests wait. When owed_idle() first counted it, it was throttled in 31
    periods for 12 requests (one run; 8 with the change)."""
    quiet = ["--shape", "requests", "--rate-hz", "2", "--kernel-us", "1000", "--poll-us", "20"]
    with qgpu_loaded() as client, cgroups(2) as cgs:
        client.set_gpu(0, "fixed-share", PERIOD_US)
        for cg in cgs:
            client.set_cgroup(cg.id, 0, "offline", 50)
        reset()
        train, pod = start_together(
            [*SATURATE, "--seconds", "6"],
            [*quiet, "--seconds", "6"],
            cgroups=[str(c.path) for c in cgs],
        )
        requests = pod.result()["requests"]
        train.result()
        stats = {s.cgroup_id: s for s in client.cgroups()}
        trainer, quiet_pod = stats[cgs[0].id], stats[cgs[1].id]
    print(f"quiet pod: {requests} requests, throttled in {quiet_pod.nr_throttled} periods; "
          f"the trainer in {trainer.nr_throttled}")  # fmt: skip
    assert trainer.nr_throttled > 60
    assert quiet_pod.nr_throttled <= 2 * requests + 2


def engine_use_alone(args: list[str]) -> float:
    """The part of the engine a gpuload run alone (no qgpu) kept busy."""
    load = Gpuload(args).ready()
    wall = load.result()["elapsed_s"]
    return gpu_seconds(load.pid) / wall


def test_burst_share_lends_idle_time_and_takes_it_back_within_a_period() -> None:
    with qgpu_loaded() as client, cgroups(2) as cgs:
        lent, a_share, firsts = burst_hand_back(client, cgs, SATURATE, PERIOD_US)
        first = statistics.mean(firsts)
        print(f"burst-share: A alone {lent:.3f}, next to B {a_share:.3f} (first 0.5 s"
              f" {', '.join(f'{f:.3f}' for f in firsts)}: mean {first:.3f})")  # fmt: skip
        assert lent > 0.8
        assert a_share == pytest.approx(0.30, abs=0.03)
        # A hand-back a period late would add about 0.07 to the mean.
        assert first == pytest.approx(0.30, abs=0.05)


REQUEST = ["--shape", "requests", "--rate-hz", "50", "--kernel-us", "2000", "--poll-us", "20"]
# 1 000 requests a run: a p99 of 300 (6 s) is their third-slowest, and two VM stalls decided it
# (CI at 72d2750: 5.35 ms against 2 x solo's 2.60; the same test passed on its rerun, and twelve
# times in a row before with 4.21 against 5.16 at the closest).
REQUEST_S = "20"


def test_online_requests_go_first_and_offline_keeps_what_they_leave() -> None:
    """Against native time-slicing in the same VM: the online pod's p50 and p99 come down, its
    p99 stays within 2 x solo's, and the offline pod keeps more, not less. The kmod issue's
    targets (p99 <= 1.5x solo, offline >= 90 % of what online leaves) are measured by `make
    bench-vm` over 1 001 requests and reported in BENCHMARKS.md; each run here has 1 000."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        solo = in_cgroup(online, [*REQUEST, "--seconds", REQUEST_S]).ready().result()
        native, native_offline, gated, gated_offline = native_then_online(
            client, online, offline, [*REQUEST, "--seconds", REQUEST_S],
            [*SATURATE, "--seconds", REQUEST_S], PERIOD_US,
        )  # fmt: skip
        print(
            f"online p50/p99: solo {solo['p50_ms']:.2f}/{solo['p99_ms']:.2f} ms, native"
            f" {native['p50_ms']:.2f}/{native['p99_ms']:.2f} ms, qgpu {gated['p50_ms']:.2f}/"
            f"{gated['p99_ms']:.2f} ms; offline GPU share: native {native_offline:.3f},"
            f" qgpu {gated_offline:.3f}"
        )
        # In a VM of one vCPU, solo 2.31 / 2.54 ms, native 5.51 / 7.81, qgpu 2.57 / 3.54 (p50 /
        # p99, 2026-12-04). In one of two vCPUs solo's p99 was 3-4 x its p50, the vCPUs' stalls,
        # and the p99 was held to solo's alone.
        assert gated["p50_ms"] < 0.75 * native["p50_ms"]
        assert gated["p99_ms"] < native["p99_ms"]
        assert gated["p99_ms"] <= 2.0 * solo["p99_ms"]
        assert gated_offline >= 0.95 * native_offline
        # One offline process, its TSG at the class's 1 us timeslice: the GPU makes way for
        # online work by itself, and qgpu does not close it for that work (its default,
        # online_gate=0, closes nothing; 1 closes only a pod of several processes:
        # test_qgpu_cuda_shape.py).
        stats = {s.cgroup_id: s for s in client.cgroups()}
        assert stats[offline.id].throttled_ns < 60_000_000, stats[offline.id]
        assert stats[online.id].nr_throttled == 0
