"""A configured cgroup governs every cgroup below it (the Kubernetes shape: the daemon
configures the pod slice, processes run in container scopes below it).

The nearest configured ancestor wins, for allocation charging, memory limits, the tenant guard
and time slices; a tenant moving itself into a child cgroup stays gated; configuring a cgroup
later charges what its descendants already hold to it. Also: removed cgroups are reaped however
many are configured, and events go out only to listeners, rate-limited (all but a removed
cgroup's, which a refusal flood cannot crowd out).
Ground truth: nvmock's engine (GPU time) and RM's answers as the tenant sees them.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.enforcers.kmod.uapi import EVENT_RATE_PER_SEC, Event
from qpolicy.nvrm.abi import NvStatus
from tests.vm.nvmock import DEBUGFS, reset
from tests.vm.qgpu_env import (
    CGROUP_ROOT,
    SYSFS,
    Cgroup,
    drain,
    ensure_cgroup2,
    gpu_seconds,
    in_cgroup,
    qgpu_loaded,
    refusal_events,
    remove_tree,
    stats_of,
)
from tests.vm.worker import Worker

MIB = 1 << 20
SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]
DENIED = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS


@contextmanager
def pod(*containers: str) -> Iterator[tuple[Cgroup, list[Cgroup]]]:
    """A pod slice with container cgroups below it (a container name may be nested: a/b)."""
    ensure_cgroup2()
    top = Cgroup(CGROUP_ROOT / f"qgpu-pod-{uuid.uuid4().hex[:8]}")
    top.path.mkdir()
    made = []
    try:
        for name in containers:
            (top.path / name).mkdir(parents=True)
            made.append(Cgroup(top.path / name))
        yield top, made
    finally:
        remove_tree(top.path)


def held(client: QgpuClient, cg: Cgroup) -> tuple[int, int, int]:
    stats = stats_of(client, cg)
    return stats.clients, stats.tsgs, stats.mem_used


def test_a_container_below_a_configured_pod_is_charged_limited_and_guarded() -> None:
    with qgpu_loaded() as client, pod("ctr/sub") as (slice_, (ctr,)):
        client.set_gpu(0, "fixed-share", 50_000)
        client.set_cgroup(slice_.id, 0, "offline", 30, mem_limit=64 * MIB)
        worker = Worker(ctr.path)
        try:
            # Charged to the pod: its client and TSG, then its memory, up to the pod's limit.
            assert held(client, slice_) == (1, 1, 0)
            assert worker.alloc(32) == NvStatus.NV_OK
            assert worker.alloc(48) == NvStatus.NV_ERR_NO_MEMORY
            stats = stats_of(client, slice_)
            assert (stats.mem_used, stats.oom) == (32 * MIB, 1)
            # The tenant guard: its own disabling control is refused, and counted on the pod.
            assert worker.deny(3) == {DENIED: 3}
            assert stats_of(client, slice_).denied == 3
        finally:
            worker.close()
        assert held(client, slice_) == (0, 0, 0)
        # The container itself is not configured: only the pod is listed.
        assert [s.cgroup_id for s in client.cgroups()] == [slice_.id]


def test_a_container_below_a_configured_pod_is_sliced() -> None:
    with qgpu_loaded() as client, pod("ctr") as (slice_, (ctr,)):
        client.set_gpu(0, "fixed-share", 50_000)
        client.set_cgroup(slice_.id, 0, "offline", 30)
        reset()
        load = in_cgroup(ctr, [*SATURATE, "--seconds", "4"]).ready()
        result = load.result()
        fraction = gpu_seconds(load.pid) / result["elapsed_s"] * 100
        print(f"container below a fixed-share 30 pod -> {fraction:.2f}")
        assert fraction <= 30 + 1
        assert stats_of(client, slice_).nr_throttled > 0


def test_a_tenant_moving_itself_to_a_child_cgroup_stays_gated() -> None:
    """...and its refusals are counted on, and sent as events naming, the configured cgroup (a
    listener knows the pods it configured, not the scopes below them)."""
    with qgpu_loaded() as client, pod() as (slice_, _), QgpuClient.open() as watcher:
        watcher.subscribe_events()
        client.set_gpu(0, "fixed-share", 50_000)
        client.set_cgroup(slice_.id, 0, "offline", 30, mem_limit=64 * MIB)
        worker = Worker(slice_.path)
        try:
            assert worker.alloc(32) == NvStatus.NV_OK
            # It makes itself a child cgroup (as a delegated container could) and moves there.
            escape = slice_.path / "escape"
            escape.mkdir()
            assert worker.ask(f"move {escape}") == {"moved": str(escape)}
            assert Cgroup(escape).procs() == [worker.pid]
            assert worker.alloc(48) == NvStatus.NV_ERR_NO_MEMORY
            assert worker.deny(2) == {DENIED: 2}
            stats = stats_of(client, slice_)
            assert (stats.clients, stats.mem_used, stats.oom, stats.denied) == (1, 32 * MIB, 1, 2)
            events = refusal_events(drain(watcher, quiet=0.5))
            assert sorted(events) == [(Event.OOM, slice_.id)] + [(Event.DENIED, slice_.id)] * 2
        finally:
            worker.close()


def test_configuring_later_charges_what_the_cgroups_below_hold_to_the_nearest() -> None:
    with qgpu_loaded() as client, pod("ctr") as (slice_, (ctr,)):
        client.set_gpu(0, "fixed-share", 50_000)
        worker = Worker(ctr.path)
        try:
            assert worker.alloc(32) == NvStatus.NV_OK
            # The pod is configured after its container allocated: the charge moves to it.
            client.set_cgroup(slice_.id, 0, "offline", 30, mem_limit=64 * MIB)
            assert held(client, slice_) == (1, 1, 32 * MIB)
            assert worker.alloc(48) == NvStatus.NV_ERR_NO_MEMORY
            # The container configured too: it is the nearest, so it takes over.
            client.set_cgroup(ctr.id, 0, "offline", 20, mem_limit=128 * MIB)
            assert held(client, ctr) == (1, 1, 32 * MIB)
            assert held(client, slice_) == (0, 0, 0)
            assert worker.alloc(48) == NvStatus.NV_OK
            # Unconfigured again: back to the pod, with all it holds (over the pod's limit now,
            # so the next allocation is refused).
            client.del_cgroup(ctr.id)
            assert held(client, slice_) == (1, 1, 80 * MIB)
            assert worker.alloc(1) == NvStatus.NV_ERR_NO_MEMORY
            client.del_cgroup(slice_.id)
            assert client.cgroups() == []
            assert worker.alloc(1) == NvStatus.NV_OK
        finally:
            worker.close()


REAPED = 40
REMOVED = 8


@pytest.mark.parametrize("schedulers", ["running", "none"])
def test_removed_cgroups_are_reaped_however_many_are_configured(schedulers: str) -> None:
    """Past the first 32, and with no scheduler thread at all (nvmock posing as a driver whose
    RM entry qgpu refuses: no time slicing, the gates and the configuration still work)."""
    ensure_cgroup2()
    made = [Cgroup(CGROUP_ROOT / f"qgpu-reap-{uuid.uuid4().hex[:8]}") for _ in range(REAPED)]
    for cg in made:
        cg.path.mkdir()
    if schedulers == "none":
        (DEBUGFS / "kapi_version").write_text("575.64.05\n")
    try:
        with qgpu_loaded() as client, QgpuClient.open() as watcher:
            watcher.subscribe_events()
            if schedulers == "running":
                client.set_gpu(1, "burst-share", 100_000)
            else:
                assert (SYSFS / "rm_version").read_text() == "\n"
            ids = [cg.id for cg in made]
            for cg_id in ids:
                client.set_cgroup(cg_id, 1, "offline", 2)
            # The last ones configured, past the first 32.
            gone = ids[-REMOVED:]
            for cg in made[-REMOVED:]:
                cg.path.rmdir()
            started = time.monotonic()
            while {s.cgroup_id for s in client.cgroups()} & set(gone):
                assert time.monotonic() - started < 5, "removed cgroups still configured"
                time.sleep(0.05)
            assert {s.cgroup_id for s in client.cgroups()} == set(ids[:-REMOVED])
            assert (SYSFS / "cgroups").read_text() == f"{REAPED - REMOVED}\n"
            events = drain(watcher, quiet=1.0)
            assert sorted(e.cgroup_id for e in events if e.event == Event.CGROUP_GONE) == sorted(
                gone
            )
    finally:
        (DEBUGFS / "kapi_version").write_text("\n")
        for cg in made:
            if cg.path.exists():
                cg.path.rmdir()


def counters() -> tuple[int, int]:
    return (
        int((SYSFS / "events_sent").read_text()),
        int((SYSFS / "events_dropped").read_text()),
    )


FLOOD = 1000


def test_events_only_with_listeners_and_rate_limited() -> None:
    with qgpu_loaded() as client, pod() as (slice_, _):
        slice_id = slice_.id
        client.set_gpu(0, "fixed-share", 50_000)
        client.set_cgroup(slice_id, 0, "offline", 30)
        worker = Worker(slice_.path)
        try:
            # Nobody listens: nothing is built, nothing counted as sent or dropped.
            before = counters()
            assert worker.deny(200) == {DENIED: 200}
            assert counters() == before
            assert stats_of(client, slice_).denied == 200
            with QgpuClient.open() as watcher:
                watcher.subscribe_events()
                started = time.monotonic()
                assert worker.deny(FLOOD) == {DENIED: FLOOD}
                elapsed = time.monotonic() - started
                events = drain(watcher, quiet=1.0)
            sent, dropped = (a - b for a, b in zip(counters(), before, strict=True))
        finally:
            worker.close()
    denied = [e for e in events if e.event == Event.DENIED and e.cgroup_id == slice_id]
    print(f"{FLOOD} refusals in {elapsed:.2f} s: {len(denied)} events, {dropped} dropped")
    assert elapsed < 9, "too slow for the rate limit to show"
    assert len(denied) == sent and sent + dropped == FLOOD
    assert sent <= EVENT_RATE_PER_SEC * (math.floor(elapsed) + 1)
    assert dropped > 0


GONE_AMID_FLOOD = 3


def test_removed_cgroups_are_reported_while_refusals_flood_the_rate_limit() -> None:
    """A listener (the daemon) learns that a pod it configured was removed only from its
    CGROUP_GONE event, which comes once per configured cgroup and so is not rate-limited. A
    neighbour's flood of refusals, which spends the second's budget of OOM and DENIED events at
    once (a window of one second from its first event), must not crowd it out: each pod is
    removed right after such a flood, and reaped within the same second, and each is
    reported."""
    with (
        qgpu_loaded() as client,
        pod() as (noisy, _),
        pod(*(f"gone{i}" for i in range(GONE_AMID_FLOOD))) as (_, doomed),
        QgpuClient.open() as watcher,
    ):
        watcher.subscribe_events()
        client.set_gpu(0, "best-effort", 50_000)
        client.set_cgroup(noisy.id, 0, "offline", 30)
        for cg in doomed:
            client.set_cgroup(cg.id, 0, "offline", 30)
        gone = [cg.id for cg in doomed]
        worker = Worker(noisy.path)
        try:
            for cg, cg_id in zip(doomed, gone, strict=True):
                time.sleep(1.1)  # the window of the flood before is over
                dropped = counters()[1]
                started = time.monotonic()
                assert worker.deny(2 * EVENT_RATE_PER_SEC) == {DENIED: 2 * EVENT_RATE_PER_SEC}
                assert counters()[1] - dropped >= EVENT_RATE_PER_SEC  # the budget is spent
                cg.path.rmdir()
                while cg_id in {s.cgroup_id for s in client.cgroups()}:
                    time.sleep(0.01)
                took = time.monotonic() - started
                assert took < 1.0, f"reaped {took:.2f} s after the flood: past its window"
            events = drain(watcher, quiet=1.0)
        finally:
            worker.close()
    reported = [e.cgroup_id for e in events if e.event == Event.CGROUP_GONE]
    assert sorted(reported) == sorted(gone)
