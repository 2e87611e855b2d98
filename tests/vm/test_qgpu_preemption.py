"""qgpu's compute preemption mode for offline contexts (kmod/qgpu/timeslice.c): the CTA half of
the daemon's ``cta+timeslice-1us-8ms`` strategy, set through qgpu's kernel RM client as the rm
enforcer sets it from user space (qpolicy/enforcers/rm/preemption.py).

With the GPU's offline preemption at CTA, an offline TSG that gets its class's timeslice and
holds a compute object also gets CTA (GR_SET_CTXSW_PREEMPTION_MODE on its compute channel), and
its own mode back when its timeslice goes back. Ground truth is the mode nvmock keeps per
context (debugfs gpuN/tsgs, what GR_GET_CTXSW_MODES answers; CILP until set, as the GPUs read).
Each tenant is a process holding a TSG (tests/vm/tenant.py hold) with a compute channel in it,
which sends its own preemption request as libcuda does (CILP, on the TSG's handle).
"""

from __future__ import annotations

import errno
import time
from contextlib import ExitStack

import pytest

from qpolicy.enforcers.kmod.client import QgpuClient
from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.enforcers.kmod.uapi import Preemption
from qpolicy.nvrm import abi
from qpolicy.nvrm.abi import NvStatus
from tests.vm.nvmock import DEBUGFS, nvmock_param, tsg_rows
from tests.vm.qgpu_env import (
    SYSFS,
    HeldTenant,
    cgroups,
    held_tenants,
    insmod,
    loaded,
    qgpu_loaded,
    rmmod,
)
from tests.vm.test_qgpu_rmapi import OP_CONTROL, kapi
from tests.vm.test_qgpu_timeslices import OFFLINE_US, ONLINE_US, of, settles

WFI, CTA, CILP = abi.PREEMPTION_MODE_WFI, abi.PREEMPTION_MODE_CTA, abi.PREEMPTION_MODE_CILP
SET_MODE = abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE
GET_MODES = abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES
NV_ERR_INVALID_STATE = 0x40


def modes(*tenants: HeldTenant, gpu: int = 0) -> list[int]:
    """The compute preemption mode of each tenant's TSG, as nvmock keeps it."""
    now = {row["pid"]: row["compute_preemption"] for row in tsg_rows(gpu)}
    return [now[t.pid] for t in tenants]


def computing(*tenants: HeldTenant) -> None:
    for tenant in tenants:
        tenant.compute()


def test_offline_contexts_get_cta_with_their_timeslice_and_their_own_mode_back() -> None:
    """The lever end to end: CTA on the offline context only, set again after libcuda's own
    request, given back with the timeslice (no online cgroup, the GPU's setting back to own,
    qgpu unloaded)."""
    with cgroups(2) as (online, offline), ExitStack() as stack:
        insmod()
        stack.callback(lambda: loaded() and rmmod())
        client = stack.enter_context(QgpuClient.open())
        serving, training = stack.enter_context(held_tenants(online, offline))
        computing(serving, training)
        assert client.gpus()[0].offline_preemption is Preemption.OWN
        assert (SYSFS / "gpu0" / "offline_preemption").read_text() == "own\n"
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        assert (SYSFS / "gpu0" / "offline_preemption").read_text() == "cta\n"
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        assert settles(lambda: modes(serving, training) == [CILP, CTA]), modes(serving, training)
        assert of(serving, training) == [ONLINE_US, OFFLINE_US]
        # libcuda's own CILP passes the tenant guard and RM carries it out; qgpu sets CTA again.
        assert training.set_mode(CILP) == NvStatus.NV_OK
        assert settles(lambda: modes(training) == [CTA])
        # A coarser mode of the tenant's own is refused, as before.
        assert training.set_mode(WFI) == NvStatus.NV_ERR_INSUFFICIENT_PERMISSIONS
        assert modes(training) == [CTA]
        # No online cgroup left on the GPU: the timeslice and the mode go back together.
        client.del_cgroup(online.id)
        assert settles(lambda: modes(training) == [CILP])
        client.set_cgroup(online.id, 0, "online", 50)
        assert settles(lambda: modes(training) == [CTA])
        # The GPU's setting back to own (sysfs, as root may): the timeslice stays, the mode goes.
        (SYSFS / "gpu0" / "offline_preemption").write_text("own\n")
        assert settles(lambda: modes(training) == [CILP])
        assert of(serving, training) == [ONLINE_US, OFFLINE_US]
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        assert settles(lambda: modes(training) == [CTA])
        # Unloaded with both configured: the context has its own mode again.
        client.close()
        result = rmmod()
        assert result.returncode == 0, result.stderr
        assert modes(serving, training) == [CILP, CILP]


def test_the_mode_given_back_is_the_one_the_context_had() -> None:
    """A tenant's own mode carried out before its cgroup was gated (WFI here: any mode passes
    an ungated cgroup) is the one qgpu restores, whether it learnt it from the tenant's request
    or from GR_GET_CTXSW_MODES."""
    with qgpu_loaded() as client, cgroups(3) as (online, offline, other):
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        client.set_cgroup(online.id, 0, "online", 50)
        with held_tenants(online, offline, other) as (serving, training, second):
            computing(serving, training, second)
            assert training.set_mode(WFI) == NvStatus.NV_OK
            assert modes(training, second) == [WFI, CILP]
            client.set_cgroup(offline.id, 0, "offline", 25)
            client.set_cgroup(other.id, 0, "offline", 25)
            assert settles(lambda: modes(training, second) == [CTA, CTA])
            client.del_cgroup(offline.id)
            client.del_cgroup(other.id)
            assert settles(lambda: modes(training, second) == [WFI, CILP])


def test_a_context_is_set_once_it_computes_and_a_tsg_without_one_is_left_alone() -> None:
    """CUDA's context is the TSG with a compute object; its other TSGs keep their mode."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with held_tenants(online, offline) as (_serving, training):
            assert settles(lambda: of(training) == [OFFLINE_US])
            time.sleep(0.3)
            assert modes(training) == [CILP]
            training.compute()
            assert settles(lambda: modes(training) == [CTA])


def test_an_offline_cgroup_of_several_contexts_keeps_its_own_mode() -> None:
    """Where a cgroup keeps its own timeslices (two processes of one pod), it keeps its own
    mode too: the mode goes with the class's timeslice, as the rm enforcer sets it."""
    with qgpu_loaded() as client, cgroups(2) as (online, offline):
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        with held_tenants(online, offline) as (serving, first):
            computing(serving, first)
            assert settles(lambda: modes(first) == [CTA])
            with held_tenants(offline) as (second,):
                second.compute()
                assert settles(lambda: modes(first, second) == [CILP, CILP])
            assert settles(lambda: modes(first) == [CTA])


# nvmock's GSP controls slowed 400-fold (gsp_pct; GR_SET_CTXSW_PREEMPTION_MODE 148 ms idle,
# SET_TIMESLICE 112 ms), so that a pass with five offline contexts to set (two controls each) is
# out for over a second.
SLOW_GSP_PCT = 40_000


def test_a_tenants_mode_carried_out_while_a_pass_is_out_leaves_the_pass_timeslices() -> None:
    """libcuda's CILP carried out by RM while a pass of qgpu's is out (between its plan and its
    record) makes the pass plan that context's mode again, and only its mode: the timeslice the
    pass set, and the TSG's own it read first, are recorded. Until 44a4aec the tenant's mode
    dropped the pass's timeslice record too: the next pass read qgpu's own 1 us back as the
    TSG's own and gave it back for ever once ungated. The first context is set first (tenants
    are planned in the order their clients were made); its tenant's request is carried out
    while the last context's timeslice is still not set, so before the pass records."""
    with qgpu_loaded() as client, cgroups(6) as (online, *offline):
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        for cg in offline:
            client.set_cgroup(cg.id, 0, "offline", 20)
        with held_tenants(online, *offline) as (serving, *training):
            computing(serving, *training)
            first, last = training[0], training[-1]
            own = of(*training)
            # No online cgroup yet: nothing is set.
            assert modes(*training) == [CILP] * 5
            with nvmock_param("gsp_pct", SLOW_GSP_PCT):
                client.set_cgroup(online.id, 0, "online", 50)
                assert settles(lambda: modes(first) == [CTA])
                assert first.set_mode(CILP) == NvStatus.NV_OK
                # The pass is still out: its last control (the last TSG's timeslice) is to come.
                assert of(last) == own[-1:], "the pass ended before the tenant's request"
            assert settles(lambda: modes(*training) == [CTA] * 5), modes(*training)
            assert of(serving, *training) == [ONLINE_US] + [OFFLINE_US] * 5
            client.del_cgroup(online.id)
            assert settles(lambda: of(*training) == own), (of(*training), own)
            assert modes(*training) == [CILP] * 5


def test_a_refused_mode_is_tried_again_and_a_bad_setting_changes_nothing() -> None:
    """nvmock fails qgpu's next two GR_SET_CTXSW_PREEMPTION_MODEs (NV_ERR_INVALID_STATE, as
    GSP may answer): qgpu records nothing for them and tries again until RM carries it out.
    A GPU_SET with a mode the module does not know is refused whole."""
    with (
        qgpu_loaded() as client,
        cgroups(2) as (online, offline),
        held_tenants(online, offline) as (serving, training),
    ):
        computing(serving, training)
        client.set_cgroup(online.id, 0, "online", 50)
        client.set_cgroup(offline.id, 0, "offline", 50)
        assert settles(lambda: of(serving, training) == [ONLINE_US, OFFLINE_US])
        before, _ = kapi()
        (DEBUGFS / "kapi_fail_control").write_text(f"{SET_MODE:#x} 2")
        client.set_gpu(0, offline_preemption=Preemption.CTA)
        assert settles(lambda: modes(training) == [CTA])
        after, ops = kapi()
        # The context's own read once, two refusals, then the set.
        assert after["failed"] - before["failed"] == 2
        # (the scheduler's own controls, if any came meanwhile, left out)
        controls = [(op.what, op.status) for op in ops if op.op == OP_CONTROL]
        controls = controls[-(after["controls"] - before["controls"]) :]
        controls = [c for c in controls if c[0] in (GET_MODES, SET_MODE)]
        refused = (SET_MODE, NV_ERR_INVALID_STATE)
        assert sorted(controls) == sorted([(GET_MODES, 0), refused, refused, (SET_MODE, 0)])
        with pytest.raises(KmodError) as bad_gpu_set:
            client.set_gpu(0, offline_timeslice_us=64, offline_preemption=2)  # type: ignore[arg-type]
        assert bad_gpu_set.value.errno in (errno.EINVAL, errno.ERANGE)
        gpu0 = client.gpus()[0]
        assert (gpu0.offline_timeslice_us, gpu0.offline_preemption) == (OFFLINE_US, Preemption.CTA)
        with pytest.raises(OSError) as bad:
            (SYSFS / "gpu0" / "offline_preemption").write_text("wfi\n")
        assert bad.value.errno == errno.EINVAL
        assert (SYSFS / "gpu0" / "offline_preemption").read_text() == "cta\n"
