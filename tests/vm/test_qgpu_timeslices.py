"""qgpu's TSG timeslices by class, set through its kernel RM client (kmod/qgpu/timeslice.c).

While a GPU has a configured online cgroup, the TSGs of the cgroups configured for it get their
class's timeslice (offline 128 us, online 8192 us unless the daemon says otherwise); a TSG gets
its own back when qgpu lets go of it. Ground truth is the timeslice nvmock keeps per TSG
(debugfs gpuN/tsgs, what GET_TIMESLICE answers); each tenant is a process holding a TSG of its
own (tests/vm/tenant.py hold), which also sends its own SET_TIMESLICE as libcuda does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.enforcers.kmod.uapi import OFFLINE_TIMESLICE_DEFAULT_US, ONLINE_TIMESLICE_DEFAULT_US
from qpolicy.nvrm.abi import NvStatus
from tests.vm.nvmock import DEBUGFS, tsg_rows
from tests.vm.qgpu_env import (
    SYSFS,
    HeldTenant,
    cgroups,
    held_tenants,
    insmod,
    loaded,
    qgpu_loaded,
    rmmod,
    stats_of,
)
from tests.vm.test_qgpu_rmapi import OP_CONTROL, kapi

DEFAULT_US = 1024  # RM's for a new TSG (kfifoChannelGroupGetDefaultTimeslice_GV100)
# The module's own until the daemon says otherwise (kmod/uapi/qgpu.h, the engine's pair).
OFFLINE_US, ONLINE_US = OFFLINE_TIMESLICE_DEFAULT_US, ONLINE_TIMESLICE_DEFAULT_US
SET_TIMESLICE, GET_TIMESLICE = 0xA06C0103, 0xA06C0104
NV_ERR_INVALID_STATE = 0x40


def timeslices(gpu: int = 0) -> dict[int, int]:
    """Each TSG's timeslice by its process, as nvmock keeps it."""
    return {row["pid"]: row["timeslice_us"] for row in tsg_rows(gpu)}


def tsgs_of(tenant: HeldTenant, gpu: int = 0) -> list[int]:
    """The timeslices of every TSG of a tenant's process, as nvmock keeps them."""
    return sorted(row["timeslice_us"] for row in tsg_rows(gpu) if row["pid"] == tenant.pid)


def of(*tenants: HeldTenant) -> list[int]:
    now = timeslices()
    return [now[t.pid] for t in tenants]


def settles(want: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``want`` comes true within ``timeout`` (qgpu sets timeslices from a work item)."""
    deadline = time.monotonic() + timeout
    while not want():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_gated_tsgs_get_their_class_timeslice_and_their_own_back() -> None:
    """The lever end to end: set by class while an online cgroup is gated, the tenants' own
    requests not carried out meanwhile, each TSG's own restored when its online neighbour goes
    and when qgpu is unloaded."""
    with cgroups(2) as (online, offline), ExitStack() as stack:
        insmod()
        stack.callback(lambda: loaded() and rmmod())
        client = stack.enter_context(QgpuClient.open())
        serving, training = stack.enter_context(held_tenants(online, offline))
        # The trainer's own value, asked for before its cgroup is gated: carried out.
        assert training.set_timeslice(5000) == NvStatus.NV_OK
        assert of(serving, training) == [DEFAULT_US, 5000]
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US]), of(
            serving, training
        )
        assert [serving.timeslice(), training.timeslice()] == [ONLINE_US, OFFLINE_US]
        # libcuda sets its compute TSG's timeslice (2048 us) ~110 ms after making it: the tenant
        # guard answers NV_OK and does not carry it out.
        assert training.set_timeslice(2048) == NvStatus.NV_OK
        time.sleep(0.3)
        assert of(serving, training) == [ONLINE_US, OFFLINE_US]
        assert training.timeslice() == OFFLINE_US
        # No online cgroup left on the GPU: both TSGs get their own back, the server's what RM
        # held before qgpu's first (read with GET_TIMESLICE), the trainer's what its tenant
        # asked for since.
        client.del_cgroup(online.id)
        assert settles(lambda: of(serving, training) == [DEFAULT_US, 2048]), of(serving, training)
        # Online again: qgpu's values again.
        client.set_cgroup(online.id, 0, "online", 50)
        assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US])
        # Unloaded with both configured and both TSGs alive: each has its own again.
        client.close()
        result = rmmod()
        assert result.returncode == 0, result.stderr
        assert of(serving, training) == [DEFAULT_US, 2048]
        assert [serving.timeslice(), training.timeslice()] == [DEFAULT_US, 2048]


def test_a_tsg_made_in_a_gated_cgroup_is_set_when_it_is_made() -> None:
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with held_tenants(online, offline) as (serving, training):
            assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US], 2.0)
            client.del_cgroup(offline.id)
            # Ungated, it gets RM's default back, and its own requests are carried out again.
            assert settles(lambda: of(training) == [DEFAULT_US])
            assert training.set_timeslice(700) == NvStatus.NV_OK
            assert of(serving, training) == [ONLINE_US, 700]


def test_a_cgroup_of_two_processes_keeps_their_own_timeslices_until_one_is_left() -> None:
    """Busy TSGs of two processes of one cgroup given its class's short timeslice switch against
    each other at every slice (two 8192 trainers of one offline pod kept 0.04 % of their native
    throughput at 1 us on an H100): they keep their own, and the one left gets the class's.
    Whether the GPU preempts the offline cgroup by itself (its stats' timeslice_preempted, which
    spares it qgpu's closing for online work) follows: not while the two keep their own."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with held_tenants(online, offline) as (serving, first):
            assert settles(lambda: of(serving, first) == [ONLINE_US, OFFLINE_US])
            assert settles(lambda: stats_of(client, offline).timeslice_preempted)
            assert not stats_of(client, online).timeslice_preempted  # online: never
            with held_tenants(offline) as (second,):
                want = [ONLINE_US, DEFAULT_US, DEFAULT_US]
                assert settles(lambda: of(serving, first, second) == want), of(
                    serving, first, second
                )
                time.sleep(0.3)
                assert of(serving, first, second) == want
                # Said in the cgroup's stats (qpolicy status), the online cgroup's not.
                assert stats_of(client, offline).own_timeslices
                assert not stats_of(client, online).own_timeslices
                assert not stats_of(client, offline).timeslice_preempted
            # The second process is gone: the first is the cgroup's only one again.
            assert settles(lambda: of(serving, first) == [ONLINE_US, OFFLINE_US]), of(
                serving, first
            )
            assert not stats_of(client, offline).own_timeslices
            assert settles(lambda: stats_of(client, offline).timeslice_preempted)
            # An offline timeslice longer than the GPU's own switch to online work is worth
            # (over 1 ms): the TSG holds it, and qgpu no longer counts on it.
            client.set_gpu(0, offline_timeslice_us=2000)
            assert settles(lambda: of(first) == [2000])
            time.sleep(0.3)
            assert not stats_of(client, offline).timeslice_preempted
            client.set_gpu(0, offline_timeslice_us=1000)
            assert settles(lambda: stats_of(client, offline).timeslice_preempted)
            assert of(first) == [1000]
            # Made online, it holds the online value and is no offline cgroup to preempt.
            client.set_cgroup(offline.id, 0, "online", 50)
            assert settles(lambda: of(first) == [ONLINE_US])
            assert not stats_of(client, offline).timeslice_preempted


def test_a_cgroup_run_as_clients_of_its_own_mps_server_keeps_its_class_timeslice() -> None:
    """Processes that are clients of an MPS server in their cgroup run their kernels in the
    server's one context: a process without a compute object counts as no context beside one
    (its name is the server's, nvidia-cuda-mps), so the cgroup keeps its class's timeslice; a
    process of it with a compute object of its own is a second context."""
    with (
        qgpu_loaded() as client,
        cgroups(2) as (online, offline),
        held_tenants(online) as (serving,),
        ExitStack() as stack,
    ):
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        server = HeldTenant(offline, comm="nvidia-cuda-mps")
        stack.callback(server.close)
        assert server.ask("compute")["tsg"] == server.tsg
        clients = [HeldTenant(offline) for _ in range(2)]
        for tenant in clients:
            stack.callback(tenant.close)
        everyone = (serving, server, *clients)
        want = [ONLINE_US, OFFLINE_US, OFFLINE_US, OFFLINE_US]
        assert settles(lambda: of(*everyone) == want), of(*everyone)
        time.sleep(0.3)
        assert of(*everyone) == want
        assert not stats_of(client, offline).own_timeslices
        # A client makes a context of its own: two contexts, their own timeslices.
        assert clients[0].ask("compute")["tsg"] == clients[0].tsg
        want = [ONLINE_US, DEFAULT_US, DEFAULT_US, DEFAULT_US]
        assert settles(lambda: of(*everyone) == want), of(*everyone)
        assert stats_of(client, offline).own_timeslices


def test_a_process_with_two_cuda_contexts_keeps_its_own_timeslices() -> None:
    """A process with two computing TSGs (two CUDA contexts) would switch against itself at its
    class's short timeslice as two processes do; a compute object in its one TSG (CUDA's shape)
    changes nothing."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with held_tenants(online, offline) as (serving, training):
            assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US])
            assert training.ask("compute")["tsg"] == training.tsg
            time.sleep(0.3)
            assert of(serving, training) == [ONLINE_US, OFFLINE_US]
            assert not stats_of(client, offline).own_timeslices
            assert training.ask("context")["tsg"] != training.tsg
            # Both of its TSGs at their own (the first given back, the second never touched).
            assert settles(lambda: tsgs_of(training) == [DEFAULT_US, DEFAULT_US]), tsgs_of(training)
            assert of(serving) == [ONLINE_US]
            assert stats_of(client, offline).own_timeslices
            assert not stats_of(client, online).own_timeslices


def test_a_tenant_naming_anothers_tsg_changes_nothing_of_it() -> None:
    """A gated tenant's SET_TIMESLICE is swallowed before RM sees it; naming another tenant's
    client and TSG must not make that value the other TSG's own (RM would have refused it: a
    client is reached through the file it was made on)."""
    with (
        qgpu_loaded() as client,
        cgroups(2) as (online, offline),
        held_tenants(online, offline) as (serving, training),
    ):
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US])
        assert training.set_timeslice(1_000_000, target=serving) == NvStatus.NV_OK
        client.del_cgroup(online.id)
        client.del_cgroup(offline.id)
        assert settles(lambda: of(serving, training) == [DEFAULT_US, DEFAULT_US])
        time.sleep(0.3)
        assert of(serving, training) == [DEFAULT_US, DEFAULT_US]


def test_only_an_online_cgroup_on_the_same_gpu_turns_the_lever() -> None:
    """An offline cgroup alone keeps its TSG's own timeslice; an online cgroup configured for
    another GPU does not change that."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_cgroup(offline.id, 0, "offline", 50)
        client.set_cgroup(online.id, 1, "online", 50)
        with held_tenants(offline) as (training,):
            time.sleep(0.5)
            assert of(training) == [DEFAULT_US]
            client.set_cgroup(online.id, 0, "online", 50)
            assert settles(lambda: of(training) == [OFFLINE_US])


def test_the_values_come_from_netlink_and_sysfs_and_zero_leaves_the_tsgs_own() -> None:
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with held_tenants(online, offline) as (serving, training):
            assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US])
            client.set_gpu(0, offline_timeslice_us=64, online_timeslice_us=1_000_000)
            assert settles(lambda: of(serving, training) == [1_000_000, 64])
            gpu0 = client.gpus()[0]
            assert (gpu0.offline_timeslice_us, gpu0.online_timeslice_us) == (64, 1_000_000)
            (SYSFS / "gpu0" / "online_timeslice_us").write_text("0\n")
            assert settles(lambda: of(serving, training) == [DEFAULT_US, 64])
            assert (SYSFS / "gpu0" / "online_timeslice_us").read_text() == "0\n"
            assert (SYSFS / "gpu0" / "offline_timeslice_us").read_text() == "64\n"
            assert client.gpus()[0].online_timeslice_us == 0
            # Other GPUs keep the defaults.
            gpu1 = client.gpus()[1]
            assert (gpu1.offline_timeslice_us, gpu1.online_timeslice_us) == (OFFLINE_US, ONLINE_US)


def test_a_control_rm_refuses_is_tried_again() -> None:
    """nvmock fails qgpu's next two SET_TIMESLICEs (a test's fault, NV_ERR_INVALID_STATE as GSP
    may answer): qgpu records nothing for them and tries again until RM carries it out."""
    with (
        qgpu_loaded() as client,
        cgroups(2) as (online, offline),
        held_tenants(online, offline) as (serving, training),
    ):
        assert of(serving, training) == [DEFAULT_US, DEFAULT_US]
        before, _ = kapi()
        (DEBUGFS / "kapi_fail_control").write_text(f"{SET_TIMESLICE:#x} 2")
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US])
        after, ops = kapi()
        # Each TSG's own read once, two refusals, then each set once.
        assert after["controls"] - before["controls"] == 6
        assert after["failed"] - before["failed"] == 2
        controls = [(op.what, op.status) for op in ops if op.op == OP_CONTROL][-6:]
        assert sorted(controls) == sorted(
            [(GET_TIMESLICE, 0)] * 2
            + [(SET_TIMESLICE, NV_ERR_INVALID_STATE)] * 2
            + [(SET_TIMESLICE, 0)] * 2
        )
