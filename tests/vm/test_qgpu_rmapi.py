"""qgpu's kernel RM client against nvmock's in-kernel entry, which reads each op's parameters
where nvidia.ko 580.142 reads them (kmod/nvmock/kapi.c): NV04_ALLOC takes NVOS64, whose
pRightsRequested, paramsSize and status sit where NVOS21 has paramsSize, status and nothing.
qgpu built with NVOS21 fails both tests: its device allocation names a pRightsRequested that is
no kernel address (nvidia.ko would fault) and it reads an allocation's status where the driver
never writes one."""

from __future__ import annotations

from dataclasses import dataclass

from qpolicy.nvrm import abi
from tests.vm.nvmock import DEBUGFS, kernel_log
from tests.vm.qgpu_env import cgroups, in_cgroup, qgpu_loaded, stats_of

OP_FREE, OP_ALLOC, OP_CONTROL = 0x00, 0x15, 0x36
NV01_ROOT, NV01_DEVICE_0, NV20_SUBDEVICE_0 = 0x0, 0x80, 0x2080
FIFO_DISABLE_CHANNELS = 0x2080110B
GR_GET_CTXSW_STATS = 0x20801215
NV_ERR_INSUFFICIENT_RESOURCES = 0x1A
NV_ERR_INVALID_CLIENT = 0x23
SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]


@dataclass(frozen=True)
class Op:
    """One op as nvmock read it and what it wrote back."""

    op: int
    what: int  # the class, the handle freed or the command
    rights: int
    params_size: int
    flags: int
    status: int


# What the memory gate asks RM about a tenant's objects, and their parameter sizes.
GATE_QUERIES = {
    abi.NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO: 16,
    abi.NV0041_CTRL_CMD_GET_SURFACE_INFO: 16,
    abi.NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES: 12,
}


def gone(op: Op) -> bool:
    """The memory gate's question about a freed handle, answered "not there"."""
    return (
        op.op == OP_CONTROL
        and op.what == abi.NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO
        and op.status in (abi.NvStatus.NV_ERR_OBJECT_NOT_FOUND, abi.NvStatus.NV_ERR_INVALID_CLIENT)
    )


def kapi() -> tuple[dict[str, int], list[Op]]:
    counts: dict[str, int] = {}
    ops: list[Op] = []
    for line in (DEBUGFS / "kapi").read_text().splitlines():
        f = line.split()
        if f[0] == "op":
            ops.append(
                Op(int(f[1], 16), int(f[2], 16), int(f[4], 16), int(f[6]), int(f[8], 16),
                   int(f[10], 16))
            )  # fmt: skip
        else:
            counts[f[0]] = int(f[1])
    return counts, ops


def exit_races(ops: list[Op]) -> list[Op]:
    """The controls that named a tenant's client or TSG its exit had freed meanwhile (RM answers
    NV_ERR_INVALID_CLIENT, or NV_ERR_INVALID_OBJECT_HANDLE for a TSG; qgpu then retries a
    close batch channel by channel: apply_batch in kmod/qgpu/sched.c, and a saves read around a
    close counts for nothing: probe_close), among the last ones logged: the tenant exits at the
    end of a run."""
    return [
        op
        for op in ops
        if (op.op, op.what, op.status) == (OP_CONTROL, FIFO_DISABLE_CHANNELS, NV_ERR_INVALID_CLIENT)
        or (
            (op.op, op.what) == (OP_CONTROL, GR_GET_CTXSW_STATS)
            and op.status in (NV_ERR_INVALID_CLIENT, abi.NvStatus.NV_ERR_INVALID_OBJECT_HANDLE)
        )
    ]


def throttled_run(seconds: int = 2) -> int:
    """A fixed-share pod of 30 % saturating the GPU: qgpu opens its kernel client to close and
    open the pod's channels. The pod's throttle count."""
    with qgpu_loaded() as client, cgroups(1) as (cg,):
        client.set_gpu(0, "fixed-share", 50_000)
        client.set_cgroup(cg.id, 0, "offline", 30)
        in_cgroup(cg, [*SATURATE, "--seconds", str(seconds)]).ready().result()
        return stats_of(client, cg).nr_throttled


def test_the_kernel_client_allocates_with_nvos64() -> None:
    before, _ = kapi()
    assert throttled_run() > 0
    after, ops = kapi()
    allocs = after["allocs"] - before["allocs"]
    # Each opening of the client is a root client, its device and its subdevice, and each
    # closing frees the client; unloading closed the last.
    assert allocs >= 3 and allocs == 3 * (after["frees"] - before["frees"])
    # A control may name a tenant's client that the tenant's exit freed meanwhile: RM answers
    # NV_ERR_INVALID_CLIENT, and qgpu retries the batch channel by channel (apply_batch in
    # kmod/qgpu/sched.c), so such a race costs two failed ops. The memory gate asks RM whether
    # what a tenant freed is gone (kmod/qgpu/ioctl.c, untrack_if_gone): "not there" is the
    # answer it expects, counted by nvmock as "absent". Nothing else may fail.
    failed = [op for op in ops if op.status and not gone(op)]
    raced = exit_races(ops)
    assert failed == raced, failed
    absent = after["absent"] - before["absent"]
    assert after["failed"] - before["failed"] - absent <= len(raced)
    assert after["bad_rights"] == before["bad_rights"]
    opened = [op for op in ops if op.op == OP_ALLOC][-3:]
    # As NVOS64: no rights requested (NULL), the class's parameter size, no flags; NV_OK
    # written at NVOS64.status.
    assert [(op.what, op.rights, op.params_size, op.flags, op.status) for op in opened] == [
        (NV01_ROOT, 0, 0, 0, 0),
        (NV01_DEVICE_0, 0, 56, 0, 0),
        (NV20_SUBDEVICE_0, 0, 4, 0, 0),
    ]
    assert [op.status for op in ops if op.op == OP_FREE][-1] == 0
    controls = [op for op in ops if op.op == OP_CONTROL and op.what not in GATE_QUERIES]
    assert all(
        (op.params_size, op.flags) == (GATE_QUERIES[op.what], 0)
        for op in ops
        if op.op == OP_CONTROL and op.what in GATE_QUERIES
    )
    # Closes and opens, and the saves of an owed pod's TSGs read around a close (probe_close
    # in kmod/qgpu/sched.c), each with its parameters' size.
    sizes = {FIFO_DISABLE_CHANNELS: 536, GR_GET_CTXSW_STATS: 32}
    assert controls and all(
        (op.params_size, op.flags) == (sizes.get(op.what), 0) and (op.status == 0 or op in raced)
        for op in controls
    )
    assert any(op.what == FIFO_DISABLE_CHANNELS for op in controls)


def test_the_kernel_client_reads_an_allocations_status_where_the_driver_writes_it() -> None:
    """nvmock fails the subdevice's allocation once (a test's fault): qgpu must see the status
    nvmock wrote at NVOS64.status, free its half-made client, and succeed the next time."""
    log_lines = len(kernel_log().splitlines())
    before, _ = kapi()
    (DEBUGFS / "kapi_fail").write_text(f"{NV20_SUBDEVICE_0:#x}")
    assert throttled_run() > 0
    after, ops = kapi()
    refused = [
        line for line in kernel_log().splitlines()[log_lines:] if "no kernel RM client" in line
    ]
    assert len(refused) == 1 and f"status 0x{NV_ERR_INSUFFICIENT_RESOURCES:x}" in refused[0]
    # The one failure asked for, and otherwise only the race at the tenant's exit (it failed
    # CI once at 4975512: two ops more, the retried FIFO_DISABLE_CHANNELS of a freed client).
    others = after["failed"] - (after["absent"] - before["absent"]) - (before["failed"] + 1)
    assert 0 <= others <= len(exit_races(ops)), (others, ops)
    asked = (OP_ALLOC, NV20_SUBDEVICE_0, NV_ERR_INSUFFICIENT_RESOURCES)
    failed = [
        op for op in ops if op.status and not gone(op) and (op.op, op.what, op.status) != asked
    ]
    assert failed == exit_races(ops), failed
    # The failed opening (client, device, failed subdevice) was freed like the others.
    assert after["allocs"] - before["allocs"] == 3 * (after["frees"] - before["frees"])
    statuses = [(op.what, op.status) for op in ops if op.op == OP_ALLOC]
    failed = statuses.index((NV20_SUBDEVICE_0, NV_ERR_INSUFFICIENT_RESOURCES))
    assert statuses[failed + 1 : failed + 4] == [
        (NV01_ROOT, 0),
        (NV01_DEVICE_0, 0),
        (NV20_SUBDEVICE_0, 0),
    ]
