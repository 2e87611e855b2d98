"""The ioctl decoder and the object tracker on hand-made traffic."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpolicy.nvrm import abi, tracker
from qpolicy.nvrm.abi import Escape, Kind, Node
from qpolicy.nvrm.decode import decode
from qpolicy.nvrm.records import Record
from qpolicy.nvrm.tracker import Tracker

CTL_FD, GPU_FD = 5, 6
CLIENT, DEVICE, SUBDEVICE, TSG, CHANNEL, COMPUTE, VIDMEM = (
    0xC1D00001,
    0x1,
    0x2,
    0x10,
    0x11,
    0x12,
    0x20,
)
RM_ALLOC64 = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC, 48)
RM_ALLOC21 = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC, 32)
RM_FREE = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_FREE, 16)
RM_CONTROL = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_CONTROL, 32)
RM_ALLOC_MEMORY = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC_MEMORY, 56)
RM_DUP = abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_DUP_OBJECT, 28)

_ts = iter(range(1, 10**9))


def opened(fd: int, path: str, pid: int = 100) -> Record:
    return Record("open", next(_ts), pid, ret=fd, s=path, pid=pid, cgroup=7)


def alloc(
    parent: int,
    new: int,
    cls: int,
    *,
    root: int = CLIENT,
    size: int = 0,
    status: int = 0,
    ret: int = 0,
    nvos21: bool = False,
    pid: int = 100,
    fd: int = CTL_FD,
    params: bytes | None = None,
) -> Record:
    layout = abi.NVOS21 if nvos21 else abi.NVOS64
    p = layout.pack(
        hRoot=root,
        hObjectParent=parent,
        hObjectNew=new,
        hClass=cls,
        pAllocParms=0x1000,
        status=status,
    )
    q = abi.NV_MEMORY_ALLOCATION_PARAMS.pack(size=size) if size else bytes(96)
    if params is not None:
        q = params + bytes(max(96 - len(params), 0))
    cmd = RM_ALLOC21 if nvos21 else RM_ALLOC64
    return Record(
        "ioctl", next(_ts), pid, cmd=cmd, a1=fd, ret=ret, p=p, q=q[:96], pid=pid, cgroup=7
    )


def freed(
    handle: int, *, root: int = CLIENT, parent: int = 0, status: int = 0, pid: int = 100
) -> Record:
    p = abi.NVOS00.pack(hRoot=root, hObjectParent=parent, hObjectOld=handle, status=status)
    return Record("ioctl", next(_ts), pid, cmd=RM_FREE, a1=CTL_FD, p=p, pid=pid)


def control(handle: int, cmd: int, params: bytes, pid: int = 100) -> Record:
    p = abi.NVOS54.pack(
        hClient=CLIENT, hObject=handle, cmd=cmd, params=0x2000, paramsSize=len(params)
    )
    return Record("ioctl", next(_ts), pid, cmd=RM_CONTROL, a1=CTL_FD, p=p, q=params, pid=pid)


def basic_tree(t: Tracker, pid: int = 100) -> None:
    t.feed(opened(CTL_FD, "/dev/nvidiactl", pid))
    t.feed(opened(GPU_FD, "/dev/nvidia0", pid))
    for record in (
        alloc(0, CLIENT, 0x41, root=0, pid=pid),
        alloc(CLIENT, DEVICE, 0x80, pid=pid),
        alloc(DEVICE, SUBDEVICE, 0x2080, pid=pid),
        alloc(DEVICE, TSG, 0xA06C, pid=pid),
        alloc(TSG, CHANNEL, 0xC86F, pid=pid),
        alloc(CHANNEL, COMPUTE, 0xCBC0, pid=pid),
        alloc(DEVICE, VIDMEM, 0x40, size=64 << 20, pid=pid),
    ):
        t.feed(record)


def test_iowr_and_field_decoding_round_trip() -> None:
    assert RM_ALLOC64 == 0xC030462B and RM_CONTROL == 0xC020462A and RM_FREE == 0xC0104629
    assert abi.ioc_nr(RM_ALLOC64) == 0x2B and abi.ioc_size(RM_ALLOC64) == 48
    assert abi.ioc_type(RM_ALLOC64) == ord("F") and abi.ioc_dir(RM_ALLOC64) == 3
    assert abi.ctrl_class(0xA06C0103) == 0xA06C and abi.ctrl_category(0xA06C0103) == 1
    assert abi.ctrl_index(0xA06C0103) == 3


@pytest.mark.parametrize(
    ("path", "node"),
    [
        ("/dev/nvidiactl", Node.CTL),
        ("/dev/nvidia0", Node.GPU),
        ("/dev/nvidia17", Node.GPU),
        ("/dev/nvidia-uvm", Node.UVM),
        ("/dev/nvidia-uvm-tools", Node.UVM),
        ("/dev/nvidia-caps/nvidia-cap1", Node.CAPS),
        ("/dev/nvidia-modeset", Node.MODESET),
        ("/dev/null", Node.OTHER),
        ("/dev/nvidiax", Node.OTHER),
    ],
)
def test_nodes_by_path(path: str, node: Node) -> None:
    assert Node.of_path(path) is node


def test_nodes_by_device_number() -> None:
    assert Node.of_device(195, 255, 510) is Node.CTL
    assert Node.of_device(195, 0, 510) is Node.GPU
    assert Node.of_device(195, 254, 510) is Node.MODESET
    assert Node.of_device(510, 0, 510) is Node.UVM
    assert Node.of_device(1, 3, 510) is Node.OTHER


def test_decode_picks_the_struct_by_size_and_the_params_by_class() -> None:
    record = alloc(DEVICE, VIDMEM, 0x40, size=1 << 30, nvos21=True)
    ioctl = decode(Node.CTL, record.cmd, record.p, record.q)
    assert ioctl.escape is Escape.RM_ALLOC and ioctl.size == 32 and ioctl.size_ok
    assert ioctl.fields["hObjectNew"] == VIDMEM and ioctl.params["size"] == 1 << 30
    assert ioctl.succeeded(0) and not ioctl.succeeded(-22)
    bad_size = decode(Node.CTL, abi.iowr(abi.NV_IOCTL_MAGIC, Escape.RM_ALLOC, 40), record.p)
    assert not bad_size.size_ok and not bad_size.succeeded(0)


def test_decode_controls_unknown_escapes_and_other_nodes() -> None:
    record = control(TSG, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, (500).to_bytes(8, "little"))
    ioctl = decode(Node.CTL, record.cmd, record.p, record.q)
    assert ioctl.control_name == "NVA06C_CTRL_CMD_SET_TIMESLICE"
    assert ioctl.params == {"timesliceUs": 500}
    assert decode(Node.CTL, abi.iowr(abi.NV_IOCTL_MAGIC, 0x99, 8), b"").name == "escape 0x99"
    assert decode(Node.UVM, 27, b"").name == "UVM_REGISTER_CHANNEL"
    assert decode(Node.CTL, 0x5401, b"").name == "ioctl 0x5401"
    assert decode(Node.OTHER, RM_ALLOC64, b"").escape is None


def test_a_tree_is_built_and_summarised() -> None:
    t = Tracker()
    basic_tree(t)
    s = t.summary(100)
    assert (s.clients, s.tsgs, s.channel_count) == (1, 1, 1)
    assert s.engines == {"HOPPER_COMPUTE_A": 1}
    assert s.device_bytes == s.device_peak == 64 << 20
    assert s.cgroup == 7
    assert t.handles(100, Kind.CHANNEL) == [(CLIENT, CHANNEL)]
    assert t.handles(100, Kind.SUBDEVICE) == [(CLIENT, SUBDEVICE)]


def test_failed_calls_change_nothing() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(DEVICE, 0x30, 0x40, size=1 << 30, status=abi.NvStatus.NV_ERR_NO_MEMORY))
    t.feed(alloc(DEVICE, 0x31, 0x40, size=1 << 30, ret=-22))
    t.feed(freed(TSG, status=abi.NvStatus.NV_ERR_INVALID_OBJECT_HANDLE))
    s = t.summary(100)
    assert s.device_bytes == 64 << 20 and s.tsgs == 1 and s.failed == 3


def test_free_removes_the_subtree_and_its_memory() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(TSG, 0x40, 0x40, size=1 << 20))  # memory parented under the TSG
    t.feed(freed(TSG, parent=DEVICE))
    s = t.summary(100)
    assert s.tsgs == 0 and s.channel_count == 0 and s.engines == {}
    assert s.device_bytes == 64 << 20 and s.device_peak == (64 << 20) + (1 << 20)
    t.feed(freed(DEVICE))
    assert t.summary(100).device_bytes == 0
    t.feed(freed(0xDEAD))  # unknown handle: nothing to do, nothing breaks
    t.feed(freed(CLIENT))
    assert t.summary(100).clients == 0


def test_a_reused_handle_replaces_the_old_object() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(DEVICE, VIDMEM, 0x40, size=2 << 20))  # same handle, no free seen
    assert t.summary(100).device_bytes == 2 << 20


def test_closing_the_fd_a_client_lives_on_frees_it() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(0, 0xC1D00002, 0x41, root=0, fd=GPU_FD))
    t.feed(Record("close", next(_ts), 100, a1=CTL_FD, pid=100))
    s = t.summary(100)
    assert s.clients == 1 and s.tsgs == 0 and s.device_bytes == 0


def test_exit_drops_the_process_and_processes_are_separate() -> None:
    t = Tracker()
    basic_tree(t, pid=100)
    basic_tree(t, pid=200)
    t.feed(Record("exit", next(_ts), 100, pid=100))
    assert set(t.processes) == {200}
    assert t.summary(200).tsgs == 1


def test_objects_under_unseen_parents_are_tracked_and_freed_with_their_client() -> None:
    t = Tracker()
    t.feed(opened(CTL_FD, "/dev/nvidiactl"))
    t.feed(alloc(0x77, 0x78, 0xA06C, root=0xC1D00009))  # client and device predate the trace
    t.feed(alloc(0x78, 0x79, 0xC86F, root=0xC1D00009))
    s = t.summary(100)
    assert s.tsgs == 1 and s.channel_count == 1
    t.feed(freed(0xC1D00009, root=0xC1D00009))
    assert t.summary(100).tsgs == 0


def test_os_descriptor_memory_counts_as_system_memory() -> None:
    t = Tracker()
    basic_tree(t)
    p = abi.NVOS02_WITH_FD.pack(
        hRoot=CLIENT, hObjectParent=DEVICE, hObjectNew=0x50, hClass=0x71, limit=(2 << 20) - 1, fd=-1
    )
    t.feed(Record("ioctl", next(_ts), 100, cmd=RM_ALLOC_MEMORY, a1=GPU_FD, p=p, pid=100))
    assert t.summary(100).system_bytes == 2 << 20


def test_dup_objects_are_tracked_but_not_counted_twice() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(0, 0xC1D00002, 0x41, root=0))
    p = abi.NVOS55.pack(
        hClient=0xC1D00002, hParent=0xC1D00002, hObject=0x99, hClientSrc=CLIENT, hObjectSrc=VIDMEM
    )
    t.feed(Record("ioctl", next(_ts), 100, cmd=RM_DUP, a1=CTL_FD, p=p, pid=100))
    s = t.summary(100)
    assert s.device_bytes == 64 << 20
    assert t.processes[100].clients[0xC1D00002].objects[0x99].kind is Kind.VIDMEM


def test_controls_record_timeslice_schedule_and_submit_token() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(control(TSG, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, (2048).to_bytes(8, "little")))
    t.feed(control(TSG, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, b"\x01\x00\x00"))
    t.feed(control(CHANNEL, abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, b"\x05\x00\x03\x00"))
    objects = t.processes[100].clients[CLIENT].objects
    assert objects[TSG].info == {"timeslice_us": 2048, "timeslice_sets": 1, "scheduled": 1}
    assert objects[CHANNEL].info == {"work_submit_token": 0x30005}
    assert t.summary(100).controls["NVA06C_CTRL_CMD_SET_TIMESLICE"] == 1
    # The rm enforcer's view: how often the tenant set it, and to what.
    (group,) = t.channel_groups(100)
    assert (group.tenant_sets(TSG), group.tenant_timeslice(TSG)) == (1, 2048)
    assert group.tenant_timeslice(CHANNEL) is None


def test_ioctls_on_other_files_are_counted_apart() -> None:
    t = Tracker()
    t.feed(opened(CTL_FD, "/dev/nvidiactl"))
    t.feed(Record("ioctl", next(_ts), 100, cmd=0x5401, a1=3, pid=100))
    t.feed(Record("mmap", next(_ts), 100, cmd=CTL_FD, pid=100))
    t.feed(Record("mmap", next(_ts), 100, cmd=3, pid=100))
    s = t.summary(100)
    assert (s.ioctls, s.other_ioctls, s.mmaps) == (0, 1, 1)


def test_layout_pack_rejects_unknown_fields() -> None:
    with pytest.raises(KeyError, match="no field"):
        abi.NVOS00.pack(hRoot=1, nonsense=2)
    assert abi.NVOS64.unpack(bytes(10)) == {"hRoot": 0, "hObjectParent": 0}


def test_channel_groups_name_what_a_channel_control_needs() -> None:
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(0, 0xC1D00002, 0x41, root=0, fd=GPU_FD))  # a second client without channels
    (group,) = t.channel_groups(100)
    assert (group.pid, group.cgroup, group.fd, group.client) == (100, 7, CTL_FD, CLIENT)
    assert (group.subdevice, group.channels, group.tsgs) == (SUBDEVICE, (CHANNEL,), (TSG,))
    assert t.channel_groups(999) == []


def test_a_client_on_two_gpus_is_two_groups_each_with_its_own_subdevice() -> None:
    t = Tracker()
    basic_tree(t)
    device1, subdevice1, tsg1, channel1 = 0x101, 0x102, 0x110, 0x111
    for record in (
        alloc(CLIENT, device1, 0x80, params=abi.NV0080_ALLOC_PARAMETERS.pack(deviceId=1)),
        alloc(device1, subdevice1, 0x2080),
        alloc(device1, tsg1, 0xA06C),
        alloc(tsg1, channel1, 0xC86F),
    ):
        t.feed(record)
    groups = {g.device_instance: g for g in t.channel_groups(100)}
    assert set(groups) == {0, 1}
    assert (groups[0].device, groups[0].subdevice, groups[0].channels) == (
        DEVICE,
        SUBDEVICE,
        (CHANNEL,),
    )
    assert (groups[1].device, groups[1].subdevice, groups[1].channels, groups[1].tsgs) == (
        device1,
        subdevice1,
        (channel1,),
        (tsg1,),
    )


def test_compute_channels_are_the_channels_holding_a_compute_object() -> None:
    t = Tracker()
    basic_tree(t)
    assert t.compute_channels(100) == [(CLIENT, CHANNEL, TSG)]
    assert t.compute_channels(999) == []


def test_the_h200_trace_gives_one_client_with_all_channels() -> None:
    from qpolicy.nvrm.replay import builtin_records

    t = Tracker()
    t.feed_all(builtin_records())
    (group,) = t.channel_groups(None)
    assert len(group.channels) == 20 and len(group.tsgs) == 4
    assert group.subdevice == 0x5C000003 and group.client == 0xC1D0001B
    assert (group.device, group.device_instance) == (0x5C000002, 0)
    # Its 8 compute channels are all in one TSG (the graphics/compute runlist's); the other three
    # TSGs hold copy channels only.
    compute = t.compute_channels(None)
    assert len(compute) == 8 and {tsg for _, _, tsg in compute} == {0x5C000015}
    # One CUDA context: one TSG with a compute object, which the group names.
    assert group.compute_tsgs == (0x5C000015,)
    # The group names the same 8 channels, with their TSG, for their compute preemption mode.
    assert group.compute_channels == tuple((c, tsg) for _, c, tsg in compute)
    assert group.fd is not None
    # libcuda sets the compute TSG's timeslice itself, once, 110 ms after creating it: the rm
    # enforcer sets its own again after that.
    assert group.tenant_sets(0x5C000015) == 1
    assert [group.tenant_sets(tsg) for tsg in group.tsgs if tsg != 0x5C000015] == [0, 0, 0]
    assert group.tenant_sets(0xDEAD) == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([RM_ALLOC64, RM_ALLOC21, RM_FREE, RM_CONTROL, RM_ALLOC_MEMORY, RM_DUP]),
            st.binary(max_size=64),
            st.binary(max_size=96),
            st.sampled_from([CTL_FD, GPU_FD, 99]),
            st.integers(-5, 1),
        ),
        max_size=40,
    )
)
def test_garbage_from_the_probe_never_raises(
    calls: list[tuple[int, bytes, bytes, int, int]],
) -> None:
    """The daemon feeds the tracker what tenants' processes send the driver: anything at all."""
    t = Tracker()
    t.feed(opened(CTL_FD, "/dev/nvidiactl"))
    t.feed(opened(GPU_FD, "/dev/nvidia0"))
    for cmd, p, q, fd, ret in calls:
        t.feed(Record("ioctl", next(_ts), 100, cmd=cmd, a1=fd, ret=ret, p=p, q=q, pid=100))
    t.summary(100)
    t.channel_groups(100)


def test_the_generation_moves_with_the_tree_and_not_with_counting() -> None:
    """What is derived from the tree (what a cgroup holds, the channels to stop) is rebuilt only
    when the generation moves: the rm enforcer's own FIFO_DISABLE_CHANNELS, failed calls and
    mmaps must not move it, every change to a process, its files or its tree must."""
    t = Tracker()
    basic_tree(t)

    def moves(record: Record, cause: str = "", cgroup: int | None = 7) -> bool:
        """Whether ``record`` moved the generation, checking it was counted under ``cause``, for
        ``cgroup``, and nothing else."""
        before, causes, by_cgroup = t.generation, Counter(t.changes), Counter(t.changes_by_cgroup)
        t.feed(record)
        if t.generation == before:
            assert (t.changes, t.changes_by_cgroup) == (causes, by_cgroup)
            return False
        assert t.changes - causes == Counter({cause: t.generation - before})
        assert t.changes_by_cgroup - by_cgroup == Counter({cgroup: t.generation - before})
        if cause != "exit":  # what the handle file holds of it is stale from now on
            assert t.processes[record.pid].changed_at == t.generation
        return True

    disable = abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS
    assert not moves(control(SUBDEVICE, disable, bytes(16)))
    assert not moves(alloc(DEVICE, 0x30, 0x40, size=1 << 20, status=0x1F))  # refused by RM
    assert not moves(Record("mmap", next(_ts), 100, a1=GPU_FD, pid=100, cgroup=7))
    assert not moves(control(0x99, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, bytes(8)))  # no object
    timeslice = (64).to_bytes(8, "little")
    assert moves(control(TSG, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, timeslice), "control")
    assert moves(alloc(DEVICE, 0x31, 0x40, size=1 << 20), "alloc")
    assert moves(freed(0x31), "free")
    opened = Record("open", next(_ts), 100, ret=9, s="/dev/nvidia0", pid=100, cgroup=7)
    assert moves(opened, "open")
    assert moves(Record("close", next(_ts), 100, a1=9, pid=100, cgroup=7), "close")
    # A process not seen before.
    assert moves(control(SUBDEVICE, disable, bytes(16), pid=200), "process", None)
    moved = control(SUBDEVICE, disable, bytes(16))
    assert moves(dataclasses.replace(moved, cgroup=8), "process", 8)  # the same, another cgroup
    # Its exit is its cgroup's, though the record does not say it.
    assert moves(Record("exit", next(_ts), 100, pid=100), "exit", 8)
    assert 100 not in t.processes


def test_a_free_takes_what_rm_frees_as_its_dependents() -> None:
    """RM frees the TSGs and context shares made on a VA space with it, and the channels that
    run in a context share with that (clientUpdatePendingFreeList_IMPL, 580.142); a TSG not made
    on the VA space stays."""
    vaspace, copy_tsg, copy_channel, share, shared_channel = 0x30, 0x31, 0x32, 0x33, 0x34
    t = Tracker()
    basic_tree(t)
    t.feed(alloc(DEVICE, vaspace, 0x90F1))
    on_vaspace = abi.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.pack(hVASpace=vaspace, engineType=11)
    t.feed(alloc(DEVICE, copy_tsg, 0xA06C, params=on_vaspace))
    t.feed(alloc(copy_tsg, copy_channel, 0xC86F, params=bytes(96)))
    share_params = abi.NV_CTXSHARE_ALLOCATION_PARAMETERS.pack(hVASpace=vaspace, flags=1)
    t.feed(alloc(TSG, share, 0x9067, params=share_params))
    in_share = abi.NV_CHANNEL_ALLOC_PARAMS.pack(hContextShare=share, engineType=1)
    t.feed(alloc(TSG, shared_channel, 0xC86F, params=in_share))
    assert t.summary(100).tsgs == 2 and t.summary(100).channel_count == 3

    t.feed(freed(share, parent=TSG))
    assert sorted(t.handles(100, Kind.CHANNEL)) == [(CLIENT, CHANNEL), (CLIENT, copy_channel)]
    t.feed(alloc(TSG, share, 0x9067, params=share_params))
    t.feed(alloc(TSG, shared_channel, 0xC86F, params=in_share))
    t.feed(freed(vaspace, parent=DEVICE))
    assert t.handles(100, Kind.TSG) == [(CLIENT, TSG)]
    assert t.handles(100, Kind.CHANNEL) == [(CLIENT, CHANNEL)]
    assert t.summary(100).engines == {"HOPPER_COMPUTE_A": 1}


def test_forget_drops_what_rm_no_longer_has_and_moves_the_generation() -> None:
    t = Tracker()
    basic_tree(t)
    before = t.generation
    assert t.forget(100, CLIENT, [CHANNEL, 0xDEAD])
    assert t.handles(100, Kind.CHANNEL) == [] and t.summary(100).engines == {}
    assert t.generation > before
    assert t.changes["forget"] == 1
    assert not t.forget(100, CLIENT, [CHANNEL])  # gone already
    assert not t.forget(100, CLIENT, [CLIENT])  # never the client itself
    assert not t.forget(999, CLIENT, [TSG])  # another process
    assert t.handles(100, Kind.TSG) == [(CLIENT, TSG)]


def test_the_changes_per_cgroup_are_bounded_and_keep_the_busiest() -> None:
    """Pods come and go for weeks: the count per cgroup keeps the busiest half once it holds
    more than CGROUPS_COUNTED cgroups, so a churning cgroup is still named."""
    t = Tracker()
    for _ in range(50):
        t.changed("alloc", 1)  # the churner
    for cgroup in range(2, tracker.CGROUPS_COUNTED + 10):
        t.changed("open", cgroup)
    assert len(t.changes_by_cgroup) <= tracker.CGROUPS_COUNTED
    assert t.changes_by_cgroup.most_common(1) == [(1, 50)]
    assert t.changes == {"alloc": 50, "open": tracker.CGROUPS_COUNTED + 8}
