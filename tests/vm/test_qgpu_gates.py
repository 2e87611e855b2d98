"""qgpu's memory gate and tenant guard, against nvmock, with pods as cgroups."""

from __future__ import annotations

import errno

import pytest

from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.nvrm.abi import NvStatus
from tests.vm.nvmock import DEBUGFS, kernel_log
from tests.vm.qgpu_env import cgroups, qgpu_loaded, refcount, stats_of, tenant

GIB = 1 << 30
# Interleave levels: the one nvmock makes a TSG with (a GSP GPU answers GET_INTERLEAVE_LEVEL
# NV_ERR_NOT_SUPPORTED, so RM's own was never read), and NVA06C_INTERLEAVE_LEVEL_HIGH, which the
# levers ask for.
DEFAULT_INTERLEAVE = 0
HIGH_INTERLEAVE = 2


def test_memory_limit_refuses_the_allocation_that_would_exceed_it() -> None:
    with qgpu_loaded() as client, cgroups(2) as (limited, neighbour):
        client.set_cgroup(limited.id, 0, "offline", 50, mem_limit=GIB)
        client.set_cgroup(neighbour.id, 0, "offline", 50, mem_limit=0)
        # 512 + 256 + 256 = 1 GiB fits exactly; the next MiB does not; the driver would have
        # had room (the mock GPU has 141 GiB), so the refusal is the gate's.
        out = tenant(limited, "vidmem", "512", "256", "256", "1", "2048")
        assert out["statuses"] == [
            NvStatus.NV_OK,
            NvStatus.NV_OK,
            NvStatus.NV_OK,
            NvStatus.NV_ERR_NO_MEMORY,
            NvStatus.NV_ERR_NO_MEMORY,
        ]
        # The neighbour is not limited by it.
        assert tenant(neighbour, "vidmem", "2048", "2048")["statuses"] == [NvStatus.NV_OK] * 2
        stats = {s.cgroup_id: s for s in client.cgroups()}
        assert stats[limited.id].oom == 2 and stats[neighbour.id].oom == 0
        # Both processes exited: their usage went with them.
        assert stats_of(client, limited).mem_used == 0 and stats_of(client, neighbour).mem_used == 0


def test_an_allocation_wrapped_in_xfer_meets_the_same_gate() -> None:
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=GIB)
        out = tenant(cg, "xfer", "1024", "1")
        assert out["statuses"] == [NvStatus.NV_OK, NvStatus.NV_ERR_NO_MEMORY]
        assert stats_of(client, cg).mem_used == 0


def test_memory_usage_is_released_by_free_and_by_exit() -> None:
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=GIB)
        # Each tenant run frees its client at the end: a new run starts from zero again.
        for _ in range(3):
            assert tenant(cg, "vidmem", "1024")["statuses"] == [NvStatus.NV_OK]
            assert stats_of(client, cg).mem_used == 0


def test_a_gated_tenants_own_scheduling_controls_are_refused() -> None:
    with qgpu_loaded() as client, cgroups(2) as (gated, free):
        client.set_cgroup(gated.id, 0, "offline", 50)
        out = tenant(gated, "guard")
        denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        # Steering is refused; what CUDA sends while it sets up a context still succeeds, and
        # its timeslice request is not carried out.
        assert out["schedule_disable"] == denied
        assert out["preempt"] == denied
        assert out["disable_channels"] == denied
        assert out["schedule_enable"] == NvStatus.NV_OK
        assert out["set_timeslice"] == NvStatus.NV_OK and out["timeslice_us"] == 1024
        assert {s.cgroup_id: s.denied for s in client.cgroups()}[gated.id] == 4
        # A process in a cgroup qgpu does not gate keeps the driver's behaviour.
        out = tenant(free, "guard")
        assert out["set_timeslice"] == NvStatus.NV_OK and out["timeslice_us"] == 100
        assert out["schedule_disable"] == NvStatus.NV_OK
        assert out["disable_channels"] == NvStatus.NV_OK


def test_a_gated_tenants_other_preemption_levers_are_refused() -> None:
    """Interleave levels through a channel or on the TSG itself, realtime TSGs, runlist restarts
    and policies, stopping its own channel and a preemption mode coarser than CILP: refused by
    qgpu from a gated tenant, so the TSG's interleave level stays as RM made it (nvmock's ground
    truth; a HIGH level would have the runlist serve it before its neighbours'). CUDA's own
    request (CILP) goes through."""
    with qgpu_loaded() as client, cgroups(2) as (gated, free):
        client.set_cgroup(gated.id, 0, "offline", 50)
        out = tenant(gated, "levers")
        denied = NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        refused = [
            "channel_interleave",
            "tsg_interleave",
            "make_realtime",
            "restart_runlist",
            "sched_policy",
            "preempt_cta",
            "stop_channel",
        ]
        assert {name: out[name] for name in refused} == dict.fromkeys(refused, denied)
        assert out["preempt_cilp"] == NvStatus.NV_OK
        assert out["channel_after_stop"] == [1, 1]  # still enabled and scheduled
        assert out["interleave_after"] == [DEFAULT_INTERLEAVE]
        assert {s.cgroup_id: s.denied for s in client.cgroups()}[gated.id] == len(refused)
        # Ungated, each reaches nvmock, which answers as GSP did on an H100 and an H200
        # (NV_OK to a root tenant; nvmock's control.c).
        out = tenant(free, "levers")
        assert out == {
            "channel_interleave": NvStatus.NV_OK,
            "tsg_interleave": NvStatus.NV_OK,
            "make_realtime": NvStatus.NV_OK,
            "restart_runlist": NvStatus.NV_OK,
            "sched_policy": NvStatus.NV_OK,
            "preempt_cilp": NvStatus.NV_OK,
            "preempt_cta": NvStatus.NV_OK,
            "stop_channel": NvStatus.NV_OK,
            "channel_after_stop": [0, 0],
            "interleave_after": [HIGH_INTERLEAVE],
        }


def test_without_the_drivers_rm_entry_gates_hold_and_time_slicing_is_refused() -> None:
    """A driver whose kernel RM entry qgpu refuses (one of another branch than the 580 its
    RM ABI was written for; nvmock poses as one) costs the time slices, not the gates."""
    log_lines = len(kernel_log().splitlines())
    (DEBUGFS / "kapi_version").write_text("575.64.05\n")
    try:
        with qgpu_loaded() as client, cgroups(1) as (cg,):
            said = kernel_log().splitlines()[log_lines:]
            refused = [line for line in said if "575.64.05" in line]
            assert len(refused) == 1 and "time slicing is off" in refused[0], refused
            with pytest.raises(KmodError) as error:
                client.set_gpu(0, "fixed-share", 50_000)
            assert error.value.errno == errno.EOPNOTSUPP
            client.set_cgroup(cg.id, 0, "offline", 50, mem_limit=GIB)
            out = tenant(cg, "vidmem", "1024", "1")
            assert out["statuses"] == [NvStatus.NV_OK, NvStatus.NV_ERR_NO_MEMORY]
            assert stats_of(client, cg).mem_used == 0
    finally:
        (DEBUGFS / "kapi_version").write_text("\n")
    # Nothing of the entry was kept: nvmock is free to go.
    assert refcount("nvmock") == 0
