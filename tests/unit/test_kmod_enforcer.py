"""QgpuClient and the kmod enforcer against an in-process qgpu.ko (tests/unit/qgpu_fake.py)."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from qpolicy.enforcers.kmod.client import QgpuClient, connect
from qpolicy.enforcers.kmod.enforcer import KmodEnforcer, kernel_shares, unenforceable
from qpolicy.enforcers.kmod.error import KmodError
from qpolicy.enforcers.kmod.sysfs import read_sysfs
from qpolicy.enforcers.kmod.transport import NetlinkTransport
from qpolicy.enforcers.kmod.uapi import (
    GENL_VERSION,
    OFFLINE_TIMESLICE_DEFAULT_US,
    ONLINE_TIMESLICE_DEFAULT_US,
    PERIOD_DEFAULT_US,
    TIMESLICE_MAX_US,
    Attr,
    CgroupClass,
    Cmd,
    Event,
    Policy,
    Preemption,
    QgpuMsg,
)
from qpolicy.enforcers.strategy import DEFAULT, OnlineStrategy, doctor_cache_path
from qpolicy.engine import OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US
from qpolicy.errors import QPolicyError
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec
from qpolicy.state import DesiredState
from qpolicy.telemetry.cgroups import CgroupError, cgroup_id
from tests.unit.qgpu_fake import FakeQgpu, Sent

GiB = 2**30
U8, U32, U64 = 5, 8, 12  # attribute lengths on the wire: a 4-byte header and the value


@pytest.fixture
def fake() -> FakeQgpu:
    return FakeQgpu()


@pytest.fixture
def client(fake: FakeQgpu) -> QgpuClient:
    return QgpuClient(fake)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A cgroup hierarchy: directories stand for cgroups, inode numbers for their ids."""
    hierarchy = tmp_path / "cgroup"
    for name in ("a", "b", "c", "kubepods.slice/pod-x"):
        (hierarchy / name).mkdir(parents=True)
    return hierarchy


def ino(path: Path) -> int:
    return os.stat(path).st_ino


def fixed(*pods: PodSpec, period_ms: int = 50, gpu: int = 0) -> DesiredState:
    return DesiredState(
        gpus={gpu: GpuConfig(gpu, GpuPolicy.FIXED_SHARE, period_ms)}, pods={p.id: p for p in pods}
    )


def summary(sent: list[Sent]) -> list[tuple[Cmd, dict[Attr, int]]]:
    return [(s.cmd, s.values) for s in sent]


# The engine's timeslices (the default strategy), as every GPU_SET of the enforcer carries them.
# What every GPU_SET of the default strategy carries besides the policy and period.
SLICES = {
    Attr.OFFLINE_TIMESLICE_US: OFFLINE_TIMESLICE_US,
    Attr.ONLINE_TIMESLICE_US: 8192,
    Attr.OFFLINE_PREEMPTION: Preemption.OWN,
}


# -- the messages -------------------------------------------------------------------------------


def test_messages_carry_the_headers_attribute_numbers_and_types(
    client: QgpuClient, fake: FakeQgpu
) -> None:
    client.set_gpu(1, Policy.FIXED_SHARE, 20_000)
    client.set_cgroup(2**40 + 3, 1, CgroupClass.ONLINE, 30, 8 * GiB)
    client.del_cgroup(2**40 + 3)
    client.cgroups()
    client.gpus()
    gpu_set, cgroup_set, cgroup_del, cgroup_get, gpu_get = fake.sent
    assert (gpu_set.cmd, gpu_set.dump) == (Cmd.GPU_SET, False)
    assert gpu_set.raw == [(1, U32), (2, U8), (3, U32)]
    assert gpu_set.values == {Attr.GPU: 1, Attr.POLICY: 1, Attr.PERIOD_US: 20_000}
    assert cgroup_set.raw == [(4, U64), (1, U32), (5, U8), (6, U32), (7, U64)]
    assert cgroup_set.values == {
        Attr.CGROUP_ID: 2**40 + 3,
        Attr.GPU: 1,
        Attr.CLASS: 1,
        Attr.SHARE: 30,
        Attr.MEM_LIMIT: 8 * GiB,
    }
    assert (cgroup_del.cmd, cgroup_del.raw) == (Cmd.CGROUP_DEL, [(4, U64)])
    assert (cgroup_get.cmd, cgroup_get.dump, cgroup_get.raw) == (Cmd.CGROUP_GET, True, [])
    assert (gpu_get.cmd, gpu_get.dump, gpu_get.raw) == (Cmd.GPU_GET, True, [])


def test_the_message_header_names_the_command_and_the_interface_version(
    client: QgpuClient, fake: FakeQgpu
) -> None:
    client.set_gpu(0, period_us=10_000)
    (sent,) = fake.sent
    assert (sent.cmd, sent.version) == (Cmd.GPU_SET, GENL_VERSION)
    # Only what is given is sent: the period alone leaves the policy as it is.
    assert sent.values == {Attr.GPU: 0, Attr.PERIOD_US: 10_000}


def test_set_gpu_and_set_cgroup_take_qpolicys_spellings_too(
    client: QgpuClient, fake: FakeQgpu
) -> None:
    client.set_gpu(0, "bs")
    client.set_gpu(1, GpuPolicy.FIXED_SHARE)
    client.set_cgroup(7, 0, "online", 10)
    client.set_cgroup(8, 0, PodClass.OFFLINE, 10)
    assert [s.values.get(Attr.POLICY, s.values.get(Attr.CLASS)) for s in fake.sent] == [
        Policy.BURST_SHARE,
        Policy.FIXED_SHARE,
        CgroupClass.ONLINE,
        CgroupClass.OFFLINE,
    ]
    with pytest.raises(ValueError, match="policy, a period, a timeslice or a preemption"):
        client.set_gpu(0)


def test_answers_are_read_into_stats(client: QgpuClient, fake: FakeQgpu) -> None:
    client.set_gpu(1, Policy.BURST_SHARE, 20_000)
    client.set_cgroup(5, 1, CgroupClass.ONLINE, 40, GiB)
    fake.count(5, mem_used=GiB // 2, open_ns=3_000_000, nr_throttled=2, busy=1, channels=12)
    fake.gpus[1] |= {Attr.NR_PERIODS: 9, Attr.SWITCHES: 4, Attr.ONLINE_BUSY: 1}
    (stats,) = client.cgroups()
    assert (stats.cgroup_id, stats.gpu, stats.klass, stats.share) == (5, 1, CgroupClass.ONLINE, 40)
    assert (stats.mem_limit, stats.mem_used, stats.open_ns) == (GiB, GiB // 2, 3_000_000)
    assert (stats.nr_throttled, stats.channels, stats.busy, stats.oom) == (2, 12, True, 0)
    gpu0, gpu1 = client.gpus()
    assert (gpu0.gpu, gpu0.policy, gpu0.period_us) == (0, Policy.BEST_EFFORT, PERIOD_DEFAULT_US)
    assert (gpu1.policy, gpu1.period_us, gpu1.nr_periods, gpu1.switches) == (
        Policy.BURST_SHARE,
        20_000,
        9,
        4,
    )
    assert gpu1.online_busy and not gpu0.online_busy


def test_timeslices_are_sent_as_u32s_and_read_back(client: QgpuClient, fake: FakeQgpu) -> None:
    client.set_gpu(1, offline_timeslice_us=1, online_timeslice_us=TIMESLICE_MAX_US)
    (sent,) = fake.sent
    assert sent.raw == [(1, U32), (23, U32), (24, U32)]
    assert sent.values == {
        Attr.GPU: 1,
        Attr.OFFLINE_TIMESLICE_US: 1,
        Attr.ONLINE_TIMESLICE_US: TIMESLICE_MAX_US,
    }
    # One class alone leaves the other, and the policy and period, as they are.
    client.set_gpu(1, online_timeslice_us=0)
    gpu0, gpu1 = client.gpus()
    assert (gpu1.policy, gpu1.period_us) == (Policy.BEST_EFFORT, PERIOD_DEFAULT_US)
    assert (gpu1.offline_timeslice_us, gpu1.online_timeslice_us) == (1, 0)
    assert (gpu0.offline_timeslice_us, gpu0.online_timeslice_us) == (
        OFFLINE_TIMESLICE_DEFAULT_US,
        ONLINE_TIMESLICE_DEFAULT_US,
    )
    with pytest.raises(KmodError, match=r"offline_timeslice_us=1000001: .*\(ERANGE\)"):
        client.set_gpu(0, offline_timeslice_us=TIMESLICE_MAX_US + 1)
    with pytest.raises(KmodError, match=r"online_timeslice_us 4294967296 is not a u32"):
        client.set_gpu(0, online_timeslice_us=2**32)


def test_the_offline_preemption_is_sent_as_a_u8_and_read_back(
    client: QgpuClient, fake: FakeQgpu
) -> None:
    client.set_gpu(1, offline_preemption=Preemption.CTA)
    (sent,) = fake.sent
    assert sent.raw == [(1, U32), (27, U8)]
    gpu0, gpu1 = client.gpus()
    assert (gpu0.offline_preemption, gpu1.offline_preemption) == (Preemption.OWN, Preemption.CTA)
    with pytest.raises(KmodError, match=r"offline_preemption=2: .*\(ERANGE\)"):
        client.set_gpu(0, offline_preemption=2)  # type: ignore[arg-type]


def test_the_modules_defaults_are_the_engines() -> None:
    """qgpu.ko's timeslices before the daemon sets any are the ones the engine plans."""
    assert (OFFLINE_TIMESLICE_DEFAULT_US, ONLINE_TIMESLICE_DEFAULT_US) == (
        OFFLINE_TIMESLICE_US,
        ONLINE_TIMESLICE_US,
    )
    assert (DEFAULT.offline_timeslice_us, DEFAULT.online_timeslice_us) == (
        OFFLINE_TIMESLICE_US,
        ONLINE_TIMESLICE_US,
    )


def test_an_answer_this_qpolicy_cannot_read_is_an_error(client: QgpuClient, fake: FakeQgpu) -> None:
    fake.gpus[0][Attr.POLICY] = 7
    with pytest.raises(KmodError, match="GPU_GET with Policy 7"):
        client.gpus()


def test_events(client: QgpuClient, fake: FakeQgpu) -> None:
    client.subscribe_events()
    assert fake.subscribed == ["events"]
    event = QgpuMsg()
    event["cmd"] = Cmd.EVENT
    event["attrs"] = [("QGPU_A_EVENT", Event.OOM), ("QGPU_A_CGROUP_ID", 9), ("QGPU_A_GPU", 1)]
    fake.events.append(event)
    (got,) = client.events()
    assert (got.event, got.cgroup_id, got.gpu) == (Event.OOM, 9, 1)


# -- errors -------------------------------------------------------------------------------------


def test_a_refusal_names_the_command_the_values_and_the_errno(
    client: QgpuClient, fake: FakeQgpu
) -> None:
    fake.refuse[Cmd.CGROUP_SET] = errno.EINVAL
    with pytest.raises(KmodError) as caught:
        client.set_cgroup(12, 0, CgroupClass.ONLINE, 30)
    assert str(caught.value) == (
        "qgpu.ko refused CGROUP_SET cgroup_id=12 gpu=0 class=online share=30 mem_limit=0: "
        "Invalid argument (EINVAL)"
    )
    assert caught.value.errno == errno.EINVAL
    assert isinstance(caught.value, QPolicyError)
    # All or nothing: nothing was configured, and the client does not think otherwise.
    assert fake.cgroups == {} and client.placed == {}


def test_the_modules_reason_is_part_of_the_error(client: QgpuClient, fake: FakeQgpu) -> None:
    client.set_gpu(0, Policy.FIXED_SHARE)
    client.set_cgroup(1, 0, CgroupClass.OFFLINE, 60)
    with pytest.raises(KmodError) as caught:
        client.set_cgroup(2, 0, CgroupClass.OFFLINE, 60)
    assert str(caught.value) == (
        "qgpu.ko refused CGROUP_SET cgroup_id=2 gpu=0 class=offline share=60 mem_limit=0: "
        "Invalid argument (EINVAL): qgpu: fixed-share shares on this GPU would sum to more than 100"
    )


def test_the_kernels_own_checks_come_back_as_errors(client: QgpuClient) -> None:
    with pytest.raises(KmodError, match=r"GPU_SET gpu=9 policy=fixed-share: .*\(EINVAL\)"):
        client.set_gpu(9, Policy.FIXED_SHARE)
    with pytest.raises(KmodError, match=r"period_us=10: .*\(ERANGE\)"):
        client.set_gpu(0, period_us=10)
    with pytest.raises(KmodError, match=r"CGROUP_DEL cgroup_id=4: .*\(ENOENT\)"):
        client.del_cgroup(4)


def test_without_cap_net_admin_the_error_says_so(client: QgpuClient, fake: FakeQgpu) -> None:
    fake.unprivileged = True
    with pytest.raises(KmodError, match=r"\(EPERM\); .*CAP_NET_ADMIN") as caught:
        client.cgroups()
    assert caught.value.errno == errno.EPERM


def test_values_that_do_not_fit_their_attribute_are_refused_before_sending(
    client: QgpuClient, fake: FakeQgpu
) -> None:
    with pytest.raises(KmodError, match="share -1 is not a u32"):
        client.set_cgroup(1, 0, CgroupClass.OFFLINE, -1)
    with pytest.raises(KmodError, match="cgroup_id 18446744073709551616 is not a u64"):
        client.del_cgroup(2**64)
    assert fake.sent == []


def test_connect_says_when_the_module_is_missing_old_or_refusing(tmp_path: Path) -> None:
    sysfs = tmp_path / "qgpu"
    with pytest.raises(KmodError, match=r"qgpu\.ko is not loaded .*--enforcer rm"):
        connect(sysfs, transport=FakeQgpu)
    sysfs.mkdir()
    (sysfs / "version").write_text(f"{GENL_VERSION + 1}\n")
    with pytest.raises(KmodError, match="interface version 2; this qpolicy speaks 1"):
        connect(sysfs, transport=FakeQgpu)
    (sysfs / "version").write_text(f"{GENL_VERSION}\n")
    refusing = FakeQgpu(unprivileged=True)
    with pytest.raises(KmodError, match="needs CAP_NET_ADMIN") as caught:
        connect(sysfs, transport=lambda: refusing)
    assert caught.value.errno == errno.EPERM and refusing.closed
    client = connect(sysfs, transport=FakeQgpu)
    assert isinstance(client.transport, FakeQgpu) and not client.transport.closed


def test_sysfs_is_read_file_by_file(tmp_path: Path) -> None:
    for name, value in {"version": "1", "target": "nvmock", "hooked": "1", "cgroups": "3"}.items():
        (tmp_path / name).write_text(value + "\n")
    for index, policy in ((1, "fixed-share"), (0, "best-effort")):
        gpu = tmp_path / f"gpu{index}"
        gpu.mkdir()
        (gpu / "policy").write_text(policy + "\n")
        (gpu / "period_us").write_text("50000\n")
        (gpu / "online_busy").write_text("0\n")
    (tmp_path / "gpux").mkdir()
    params = tmp_path / "parameters"
    params.mkdir()
    info = read_sysfs(tmp_path, params)
    assert (info.version, info.target, info.hooked, info.cgroups) == (1, "nvmock", True, 3)
    assert info.online_gate is None  # no such file: unknown
    (params / "online_gate").write_text("2\n")
    assert read_sysfs(tmp_path, params).online_gate == 2
    assert [(g.index, g.policy, g.period_us, g.nr_periods) for g in info.gpus] == [
        (0, "best-effort", 50_000, None),
        (1, "fixed-share", 50_000, None),
    ]
    assert (info.gpus[0].passes, info.gpus[0].userd_reads) == (None, None)  # an older module
    (tmp_path / "gpu0" / "passes").write_text("4000\n")
    (tmp_path / "gpu0" / "userd_reads").write_text("9000\n")
    gpu0 = read_sysfs(tmp_path, params).gpus[0]
    assert (gpu0.passes, gpu0.userd_reads) == (4000, 9000)


# -- cgroup ids ---------------------------------------------------------------------------------


def test_a_cgroup_id_is_the_inode_number_of_its_directory(root: Path) -> None:
    pod = root / "kubepods.slice" / "pod-x"
    assert cgroup_id("/kubepods.slice/pod-x", root) == ino(pod)
    assert cgroup_id("kubepods.slice/pod-x/", root) == ino(pod)
    assert cgroup_id(pod, root) == ino(pod)
    assert cgroup_id(str(pod), root) == ino(pod)
    assert cgroup_id("/", root) == ino(root)


def test_a_cgroup_that_is_not_there_is_a_clear_error(root: Path) -> None:
    with pytest.raises(CgroupError, match=r"cgroup '/nope': No such file or directory \(.*/nope\)"):
        cgroup_id("/nope", root)
    (root / "file").write_text("")
    with pytest.raises(CgroupError, match="is not a directory"):
        cgroup_id("/file", root)
    with pytest.raises(CgroupError, match=r"must not contain '\.\.'"):
        cgroup_id("/a/../b", root)


# -- the enforcer -------------------------------------------------------------------------------


def test_sync_pushes_the_gpu_and_every_pod_then_only_what_changed(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    specs = [PodSpec("/a", 0, PodClass.ONLINE, 60, 4 * GiB), PodSpec("/b", 0, PodClass.OFFLINE, 30)]
    enforcer = KmodEnforcer(client, cgroup_root=root)
    a, b = ino(root / "a"), ino(root / "b")
    enforcer.sync(fixed(*specs, period_ms=20))
    assert summary(fake.changes()) == [
        (Cmd.GPU_SET, {Attr.GPU: 0, Attr.POLICY: Policy.FIXED_SHARE, Attr.PERIOD_US: 20_000,
                       **SLICES}),
        (Cmd.CGROUP_SET, {Attr.CGROUP_ID: a, Attr.GPU: 0, Attr.CLASS: 1, Attr.SHARE: 60,
                          Attr.MEM_LIMIT: 4 * GiB}),
        (Cmd.CGROUP_SET, {Attr.CGROUP_ID: b, Attr.GPU: 0, Attr.CLASS: 0, Attr.SHARE: 30,
                          Attr.MEM_LIMIT: 0}),
    ]  # fmt: skip
    # The same state again: nothing to tell the module, and nothing to retry.
    enforcer.sync(fixed(*specs, period_ms=20))
    enforcer.retry()
    assert fake.changes() == []
    # A new memory limit: that pod only.
    specs[1] = PodSpec("/b", 0, PodClass.OFFLINE, 30, GiB)
    enforcer.sync(fixed(*specs, period_ms=20))
    assert summary(fake.changes()) == [
        (Cmd.CGROUP_SET, {Attr.CGROUP_ID: b, Attr.GPU: 0, Attr.CLASS: 0, Attr.SHARE: 30,
                          Attr.MEM_LIMIT: GiB}),
    ]  # fmt: skip
    # A new period: the GPU only.
    enforcer.sync(fixed(*specs, period_ms=100))
    assert summary(fake.changes()) == [
        (Cmd.GPU_SET, {Attr.GPU: 0, Attr.POLICY: Policy.FIXED_SHARE, Attr.PERIOD_US: 100_000,
                       **SLICES}),
    ]  # fmt: skip
    assert enforcer.configured["/b"].mem_limit == GiB
    assert fake.cgroups[b][Attr.MEM_LIMIT] == GiB
    assert enforcer.up is True


def test_shares_that_go_down_are_pushed_before_those_that_go_up(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    enforcer.sync(fixed(PodSpec("/a", 0, share=30), PodSpec("/b", 0, share=70)))
    fake.changes()
    enforcer.sync(fixed(PodSpec("/a", 0, share=70), PodSpec("/b", 0, share=30)))
    assert [(s.cmd, s.values[Attr.SHARE]) for s in fake.changes()] == [
        (Cmd.CGROUP_SET, 30),
        (Cmd.CGROUP_SET, 70),
    ]
    # The module checks fixed-share sums at every command; the other order would be refused.
    assert {c: v[Attr.SHARE] for c, v in fake.cgroups.items()} == {
        ino(root / "a"): 70,
        ino(root / "b"): 30,
    }


def test_a_gpu_turned_fixed_share_gets_its_shares_lowered_first(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    best_effort = DesiredState(
        gpus={0: GpuConfig(0, GpuPolicy.BEST_EFFORT)},
        pods={"/a": PodSpec("/a", 0, share=80), "/b": PodSpec("/b", 0, share=80)},
    )
    enforcer.sync(best_effort)
    fake.changes()
    enforcer.sync(fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50)))
    assert [s.cmd for s in fake.changes()] == [Cmd.CGROUP_SET, Cmd.CGROUP_SET, Cmd.GPU_SET]
    assert fake.gpus[0][Attr.POLICY] == Policy.FIXED_SHARE


def test_each_gpu_gets_its_own_strategys_timeslices(
    client: QgpuClient, fake: FakeQgpu, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The timeslices of a GPU are its online strategy's (the doctor's result for it), read
    once per GPU, pushed with the GPU's policy and period, and not again while they hold."""
    asked: list[int] = []

    def strategy(gpu: int) -> OnlineStrategy:
        asked.append(gpu)
        return OnlineStrategy(1, 1_000_000, "a test") if gpu == 1 else DEFAULT

    enforcer = KmodEnforcer(client, cgroup_root=root, strategy=strategy)
    state = DesiredState(
        gpus={g: GpuConfig(g, GpuPolicy.BURST_SHARE, 20) for g in (0, 1)},
        pods={
            "/a": PodSpec("/a", 0, PodClass.ONLINE, 50),
            "/b": PodSpec("/b", 1, PodClass.ONLINE, 50),
            "/c": PodSpec("/c", 1, PodClass.OFFLINE, 50),
        },
    )
    with caplog.at_level(logging.INFO, "qpolicy.enforcers.kmod"):
        enforcer.sync(state)
    gpu_sets = {s.values[Attr.GPU]: s.values for s in fake.changes() if s.cmd is Cmd.GPU_SET}
    assert gpu_sets[0] == {
        Attr.GPU: 0,
        Attr.POLICY: Policy.BURST_SHARE,
        Attr.PERIOD_US: 20_000,
        **SLICES,
    }
    assert (gpu_sets[1][Attr.OFFLINE_TIMESLICE_US], gpu_sets[1][Attr.ONLINE_TIMESLICE_US]) == (
        1,
        1_000_000,
    )
    assert fake.gpus[1][Attr.ONLINE_TIMESLICE_US] == 1_000_000
    assert "GPU 1: offline timeslice 1 us, online 1000000 us, from a test" in caplog.messages
    # The same state again: nothing sent, the strategy not read again.
    enforcer.sync(state)
    enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 50), period_ms=20))
    assert sorted(asked) == [0, 1]
    assert enforcer.strategies[1].source == "a test"


def test_the_cta_strategy_sends_its_timeslices_and_cta_for_offline_contexts(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    """qgpu.ko carries out both halves of ``cta+timeslice-1us-8ms`` (kmod/qgpu/timeslice.c):
    the pair and CTA on offline contexts, sent with the GPU's policy and period, once."""
    cta = OnlineStrategy(1, 8192, "qpolicy doctor of a day: cta+timeslice-1us-8ms", 1)
    enforcer = KmodEnforcer(client, cgroup_root=root, strategy=lambda gpu: cta)
    enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 50)))
    enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 60)))
    gpu_sets = [s.values for s in fake.changes() if s.cmd is Cmd.GPU_SET]
    assert len(gpu_sets) == 1
    assert gpu_sets[0][Attr.OFFLINE_PREEMPTION] == Preemption.CTA
    assert fake.gpus[0][Attr.OFFLINE_PREEMPTION] == Preemption.CTA
    assert (fake.gpus[0][Attr.OFFLINE_TIMESLICE_US], fake.gpus[0][Attr.ONLINE_TIMESLICE_US]) == (
        1,
        8192,
    )
    enforcer.read()
    assert enforcer.gpu_stats[0].offline_preemption is Preemption.CTA


def test_a_strategy_without_cta_gives_offline_contexts_their_own_mode(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    """A module left at CTA by a daemon before (the module keeps its settings) is told OWN."""
    fake.gpus[0][Attr.OFFLINE_PREEMPTION] = Preemption.CTA
    enforcer = KmodEnforcer(client, cgroup_root=root, strategy=lambda gpu: DEFAULT)
    enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 50)))
    assert fake.gpus[0][Attr.OFFLINE_PREEMPTION] == Preemption.OWN


def test_a_mode_qgpu_does_not_set_is_logged_once_and_the_timeslices_sent(
    client: QgpuClient, fake: FakeQgpu, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wfi = OnlineStrategy(1, 8192, "a cache of another qpolicy", 0)
    enforcer = KmodEnforcer(client, cgroup_root=root, strategy=lambda gpu: wfi)
    with caplog.at_level(logging.WARNING, "qpolicy.enforcers.kmod"):
        enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 50)))
        enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 60)))
    said = [m for m in caplog.messages if "which qgpu.ko does not set" in m]
    assert len(said) == 1 and said[0].startswith("GPU 0: a cache of another qpolicy")
    assert fake.gpus[0][Attr.OFFLINE_PREEMPTION] == Preemption.OWN
    assert fake.gpus[0][Attr.OFFLINE_TIMESLICE_US] == 1


def test_a_refused_timeslice_is_pushed_again(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(
        client, cgroup_root=root, strategy=lambda gpu: OnlineStrategy(64, 4096, "a test")
    )
    fake.refuse[Cmd.GPU_SET] = errno.EINVAL
    enforcer.sync(fixed(PodSpec("/a", 0, PodClass.ONLINE, 50)))
    assert fake.gpus[0][Attr.ONLINE_TIMESLICE_US] == 8192  # the module's default, still
    fake.changes()
    enforcer.retry()
    assert [s.cmd for s in fake.changes()] == [Cmd.GPU_SET]
    assert (fake.gpus[0][Attr.OFFLINE_TIMESLICE_US], fake.gpus[0][Attr.ONLINE_TIMESLICE_US]) == (
        64,
        4096,
    )


def test_the_kmod_backend_reads_the_doctors_result_for_each_gpu(tmp_path: Path) -> None:
    """What `qpolicy doctor` cached for a GPU is what the module is told to set there, and
    `qpolicy status` shows it next to what the module reports."""
    from qpolicy.backends.base import BackendContext
    from qpolicy.backends.kmod import KmodBackend
    from qpolicy.runtime.realtime import RealtimeLoop

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    doctor = {"schema": 1, "date": "2026-11-24", "recommendation": {"lever": "timeslice-1us"}}
    doctor_cache_path(state_dir, 1).write_text(json.dumps(doctor))
    cgroups = tmp_path / "cgroup"
    for name in ("a", "b"):
        (cgroups / name).mkdir(parents=True)
    fake = FakeQgpu()
    context = BackendContext(RealtimeLoop(), None, state_dir, lambda: cgroups, lambda: 0.0)
    backend = KmodBackend(context, QgpuClient(fake))
    try:
        backend.sync(
            DesiredState(
                gpus={g: GpuConfig(g, GpuPolicy.BURST_SHARE) for g in (0, 1)},
                pods={
                    "/a": PodSpec("/a", 0, PodClass.ONLINE, 50),
                    "/b": PodSpec("/b", 1, PodClass.ONLINE, 50),
                },
            )
        )
        assert (
            fake.gpus[0][Attr.OFFLINE_TIMESLICE_US],
            fake.gpus[0][Attr.ONLINE_TIMESLICE_US],
        ) == (OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US)
        assert (
            fake.gpus[1][Attr.OFFLINE_TIMESLICE_US],
            fake.gpus[1][Attr.ONLINE_TIMESLICE_US],
        ) == (
            1,
            1_000_000,
        )
        backend.publish()
        gpus = backend.status()["gpus"]
        assert (gpus["1"]["offline_timeslice_us"], gpus["1"]["online_timeslice_us"]) == (
            1,
            1_000_000,
        )
        assert gpus["1"]["offline_preemption"] == "own"  # timeslice-1us sets no mode
        assert (
            gpus["1"]["online_strategy"]["source"] == "qpolicy doctor of 2026-11-24: timeslice-1us"
        )
        assert gpus["0"]["online_strategy"] == DEFAULT.describe()
    finally:
        backend.close()


def test_a_pod_that_left_the_desired_state_is_deleted(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    a, b = ino(root / "a"), ino(root / "b")
    enforcer.sync(fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50)))
    fake.changes()
    enforcer.sync(fixed(PodSpec("/a", 0, share=50)))
    assert summary(fake.changes()) == [(Cmd.CGROUP_DEL, {Attr.CGROUP_ID: b})]
    assert set(fake.cgroups) == {a} and set(enforcer.configured) == {"/a"}


def test_a_pod_that_moves_to_another_gpu_is_moved_not_deleted(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    b = ino(root / "b")
    enforcer.sync(fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50)))
    moved = DesiredState(
        gpus={0: GpuConfig(0, GpuPolicy.FIXED_SHARE), 1: GpuConfig(1, GpuPolicy.FIXED_SHARE)},
        pods={"/a": PodSpec("/a", 0, share=50), "/b": PodSpec("/b", 1, share=50)},
    )
    enforcer.sync(moved)
    assert fake.cgroups[b][Attr.GPU] == 1 and fake.gpus[1][Attr.POLICY] == Policy.FIXED_SHARE
    assert not any(s.cmd is Cmd.CGROUP_DEL for s in fake.sent)
    enforcer.release()
    assert fake.cgroups == {}
    assert fake.gpus[0][Attr.POLICY] == fake.gpus[1][Attr.POLICY] == Policy.BEST_EFFORT


def test_the_first_push_deletes_what_a_dead_daemon_left(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    a = ino(root / "a")
    other = QgpuClient(fake)  # the daemon before, killed without releasing anything
    other.set_gpu(0, Policy.FIXED_SHARE)
    other.set_cgroup(a, 0, CgroupClass.OFFLINE, 40)
    other.set_cgroup(999, 0, CgroupClass.OFFLINE, 60)
    other.set_cgroup(998, 1, CgroupClass.OFFLINE, 60)
    fake.changes()
    enforcer = KmodEnforcer(client, cgroup_root=root)
    # 999's 60 % would not leave room for /b's 50 %.
    enforcer.sync(fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50)))
    deleted = [s.values[Attr.CGROUP_ID] for s in fake.changes() if s.cmd is Cmd.CGROUP_DEL]
    assert sorted(deleted) == [998, 999]
    assert set(fake.cgroups) == {a, ino(root / "b")}
    assert set(enforcer.configured) == {"/a", "/b"}
    enforcer.sync(fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50)))
    assert not any(s.cmd is Cmd.CGROUP_GET for s in fake.sent)  # once only


def test_best_effort_pods_without_a_share_split_what_is_left() -> None:
    pods = [PodSpec("/a", 0), PodSpec("/b", 0), PodSpec("/c", 0, share=40)]
    assert kernel_shares(pods) == {"/a": 30, "/b": 30, "/c": 40}
    assert kernel_shares([PodSpec(f"/p{i}", 0) for i in range(3)]) == {
        "/p0": 33,
        "/p1": 33,
        "/p2": 33,
    }
    # Nothing left still gives each a valid share.
    assert kernel_shares([PodSpec("/a", 0, share=100), PodSpec("/b", 0)])["/b"] == 1


def test_read_takes_the_modules_counters_at_the_publish_rate(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    a = ino(root / "a")
    enforcer.sync(fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50)))
    fake.count(a, open_ns=9_000_000, nr_throttled=4)
    enforcer.read()
    stats = enforcer.stats("/a")
    assert stats is not None and (stats.open_ns, stats.nr_throttled) == (9_000_000, 4)
    assert enforcer.gpu_stats[0].policy == Policy.FIXED_SHARE
    assert enforcer.stats("/nope") is None


def test_a_cgroup_the_module_dropped_is_looked_up_again(
    client: QgpuClient, fake: FakeQgpu, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    pods = fixed(PodSpec("/a", 0, share=50), PodSpec("/b", 0, share=50))
    enforcer.sync(pods)
    # The cgroup is removed: the module drops it (EVENT_CGROUP_GONE).
    old = ino(root / "b")
    (root / "b").rmdir()
    del fake.cgroups[old]
    enforcer.read()
    assert set(enforcer.configured) == {"/a"} and enforcer.stats("/b") is None
    with caplog.at_level(logging.WARNING, "qpolicy.enforcers.kmod"):
        for _ in range(3):
            enforcer.retry()
    assert [r.getMessage() for r in caplog.records] == [
        f"pod /b: not enforced until its cgroup exists: cgroup '/b': No such file or directory "
        f"({root / 'b'})"
    ]
    # Made again: another cgroup, with another id, configured as the pod at the next retry.
    (root / "b").mkdir()
    fake.changes()
    enforcer.retry()
    (sent,) = fake.changes()
    assert sent.values[Attr.CGROUP_ID] == ino(root / "b")


def test_names_are_refused_at_admission_with_the_reason() -> None:
    why = unenforceable(PodSpec("ml/trainer-0", 0, share=50))
    assert why is not None and "qgpu.ko governs cgroups" in why
    assert unenforceable(PodSpec("/kubepods.slice/x", 0)) is None


def test_a_refused_pod_is_reported_once_and_tried_again(
    client: QgpuClient, fake: FakeQgpu, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    pods = fixed(PodSpec("/a", 0, share=50))
    with caplog.at_level(logging.WARNING, "qpolicy.enforcers.kmod"):
        fake.refuse[Cmd.CGROUP_SET] = errno.ENOSPC
        enforcer.sync(pods)
        fake.refuse[Cmd.CGROUP_SET] = errno.ENOSPC
        enforcer.retry()
    (record,) = caplog.records
    assert record.getMessage().startswith("pod /a: qgpu.ko refused CGROUP_SET cgroup_id=")
    assert "(ENOSPC); qgpu.ko takes at most 256 cgroups" in record.getMessage()
    assert enforcer.configured == {} and enforcer.up is False
    enforcer.retry()
    assert set(enforcer.configured) == {"/a"} and enforcer.up is True


def test_release_deletes_every_pod_and_leaves_every_gpu_best_effort(
    client: QgpuClient, fake: FakeQgpu, root: Path
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    enforcer.sync(fixed(PodSpec("/a", 1, share=50), PodSpec("/b", 1, share=50), gpu=1))
    assert fake.gpus[1][Attr.POLICY] == Policy.FIXED_SHARE
    fake.changes()
    enforcer.release()
    sent = fake.changes()
    assert sorted(s.cmd for s in sent) == [Cmd.GPU_SET, Cmd.CGROUP_DEL, Cmd.CGROUP_DEL]
    assert sent[-1].values == {Attr.GPU: 1, Attr.POLICY: Policy.BEST_EFFORT}
    assert fake.cgroups == {} and enforcer.configured == {}
    assert fake.gpus[1][Attr.POLICY] == Policy.BEST_EFFORT


def test_release_of_a_cgroup_the_module_already_forgot_is_quiet(
    client: QgpuClient, fake: FakeQgpu, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    enforcer = KmodEnforcer(client, cgroup_root=root)
    enforcer.sync(fixed(PodSpec("/a", 0, share=50)))
    fake.cgroups.clear()
    with caplog.at_level(logging.WARNING):
        enforcer.release()
    assert caplog.records == [] and enforcer.configured == {}


# -- the real socket ----------------------------------------------------------------------------


def test_the_netlink_transport_says_when_the_module_is_not_loaded() -> None:
    if Path("/sys/kernel/qgpu").exists():
        pytest.skip("qgpu.ko is loaded here")
    with pytest.raises(
        KmodError, match=r"qgpu\.ko is not loaded: no generic netlink family 'qgpu'"
    ):
        NetlinkTransport()


def test_the_netlink_transport_dumps_and_acknowledges() -> None:
    """Against the kernel's own nlctrl family, which anyone may query."""
    from pyroute2.netlink import CTRL_CMD_GETFAMILY, ctrlmsg
    from pyroute2.netlink.exceptions import NetlinkError

    transport = NetlinkTransport("nlctrl", ctrlmsg)
    try:
        query = ctrlmsg()
        query["cmd"] = CTRL_CMD_GETFAMILY
        query["version"] = 1
        families = transport.request(query, dump=True)
        assert "nlctrl" in [f.get_attr("CTRL_ATTR_FAMILY_NAME") for f in families]
        query = ctrlmsg()
        query["cmd"] = CTRL_CMD_GETFAMILY
        query["version"] = 1
        query["attrs"] = [("CTRL_ATTR_FAMILY_NAME", "no-such-family")]
        with pytest.raises(NetlinkError) as caught:
            transport.request(query, dump=False)
        assert caught.value.code == errno.ENOENT
    finally:
        transport.close()
