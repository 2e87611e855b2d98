"""What RM frees with an object that is not below it, and what qgpu then still tracks.

RM frees an object's dependents with it (clientUpdatePendingFreeList_IMPL, resserv's
rs_server.c): the TSGs and context shares made on a VA space, and the channels that run in a
context share (RM's own two of a TSG in legacy mode included) and with the graphics context RM
made for their TSG (kmod/nvmock/CONFORMANCE.md;
tests/vm/rmcases.py ``dependents_freed``, ``legacy_context_shares``). qgpu tracks objects by
their parents; a channel RM freed this way that qgpu kept would be closed and opened in vain
every turn and read as busy from USERD that outlives it. Ground truth is nvmock's channel table
(debugfs gpuN/channels) next to qgpu's counts for the cgroup.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.nvrm import abi
from tests.vm.nvmock import channel_rows
from tests.vm.qgpu_env import (
    Cgroup,
    HeldTenant,
    cgroups,
    held_tenants,
    insmod,
    loaded,
    rmmod,
    stats_of,
)
from tests.vm.test_qgpu_rmapi import OP_CONTROL, kapi

KAPI_LOG = 16  # NVMOCK_KAPI_LOG: the controls nvmock's debugfs lists


def held(client: QgpuClient, tenant: HeldTenant, cgroup: Cgroup) -> tuple[int, int, int]:
    """qgpu's TSGs and channels of the tenant's cgroup, and nvmock's channels of its process."""
    stats = stats_of(client, cgroup)
    real = sum(1 for row in channel_rows() if row["pid"] == tenant.pid)
    return stats.tsgs, stats.channels, real


def channels_asked(free: Callable[[], None]) -> int:
    """How many channels qgpu asked RM about (GET_CLASS_ENGINEID, qgpu_rmapi_object_lost())
    while ``free`` ran."""
    before, _ = kapi()
    free()
    after, ops = kapi()
    new = after["controls"] - before["controls"]
    assert new <= KAPI_LOG, f"{new} kernel controls in the free: more than nvmock lists"
    controls = [op for op in ops if op.op == OP_CONTROL][-new:] if new else []
    return sum(1 for op in controls if op.what == abi.NV906F_CTRL_GET_CLASS_ENGINEID)


def test_channels_and_tsgs_rm_frees_as_dependents_are_forgotten() -> None:
    with cgroups(1) as (cg,), ExitStack() as stack:
        insmod()
        stack.callback(lambda: loaded() and rmmod())
        client = stack.enter_context(QgpuClient.open())
        (tenant,) = stack.enter_context(held_tenants(cg))
        # Made before the cgroup is configured: a configured one must name its objects, and
        # the tenant learns RM's handles from one it leaves RM to name.
        tree = tenant.ask("dependents")
        client.set_cgroup(cg.id, 0, "offline", 50)
        # hold's own TSG, the legacy TSG and the shared one; two channels in each of those.
        assert held(client, tenant, cg) == (3, 4, 4)

        def free(handle: int) -> None:
            assert tenant.ask(f"free {handle}")["status"] == 0

        # System memory has no dependents: its free costs no question to RM per channel.
        assert channels_asked(lambda: free(tree["notifier"])) == 0
        assert held(client, tenant, cg) == (3, 4, 4)
        # RM's SYNC share of the legacy TSG: the channel of thread 0 runs in it. qgpu asks
        # about each of the client's channels.
        assert channels_asked(lambda: free(tree["sync_share"])) == 4
        assert held(client, tenant, cg) == (3, 3, 3)
        # The tenant's own share: both its channels.
        free(tree["share"])
        assert held(client, tenant, cg) == (3, 1, 1)
        # The legacy TSG's graphics context, which RM made with it: its last channel.
        free(tree["graphics_context"])
        assert held(client, tenant, cg) == (3, 0, 0)
        # The VA space: the TSG made on it.
        free(tree["vaspace"])
        assert held(client, tenant, cg) == (2, 0, 0)
