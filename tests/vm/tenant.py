"""A tenant process for the qgpu tests: run inside a cgroup, it issues RM calls and prints
their statuses as one JSON object.

    python -m tests.vm.tenant vidmem MIB [MIB...]   allocate device memory, in order
    python -m tests.vm.tenant xfer MIB [MIB...]     the same, each RM_ALLOC wrapped in IOCTL_XFER
    python -m tests.vm.tenant guard                 its own scheduling controls on its own TSG
    python -m tests.vm.tenant levers                the other preemption levers, on its own
                                                    TSG, channel and subdevice, and its TSG's
                                                    interleave level after them (nvmock's)
    python -m tests.vm.tenant hold                  a TSG kept until stdin says ``quit``: prints
                                                    its handles, then answers ``set US`` and
                                                    ``get`` (its TSG's timeslice) line by line;
                                                    ``set US CLIENT TSG`` names another's TSG;
                                                    ``compute`` puts a channel with a compute
                                                    object in its TSG, ``context`` a new TSG
                                                    with one (a second CUDA context); ``mode M``
                                                    sets its TSG's compute preemption mode as
                                                    libcuda does (on the TSG's handle);
                                                    ``dependents`` makes objects RM frees with
                                                    others (a VA space, a context share) and
                                                    prints their handles, ``free H`` frees one
    python -m tests.vm.tenant hold --comm NAME      the same, named NAME (/proc/PID/comm) before
                                                    its first RM call: an MPS server's is
                                                    ``nvidia-cuda-mps``
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys

from qpolicy.nvrm import abi
from tests.vm.nvmock import DEBUGFS, tsg_rows
from tests.vm.rmclient import Rm, channel_params, ioctl, memory_params, sysmem_params, tsg_params

DEVICE_PARAMS = struct.pack("<IIIIII QQQII", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def xfer_alloc(rm: Rm, client: int, device: int, size: int) -> int:
    """RM_ALLOC of device memory sent the long way: NV_ESC_IOCTL_XFER_CMD pointing at NVOS64."""
    params = ctypes.create_string_buffer(memory_params(size), 128)
    inner = ctypes.create_string_buffer(
        struct.pack(
            "<IIIIQQIIII",
            client,
            device,
            rm.name(),
            0x40,
            ctypes.addressof(params),
            0,
            128,
            0,
            0,
            0,
        ),
        48,
    )
    xfer = bytearray(struct.pack("<IIQ", abi.Escape.RM_ALLOC, 48, ctypes.addressof(inner)))
    ioctl(rm.ctl, abi.Escape.IOCTL_XFER_CMD, xfer)
    return int(struct.unpack_from("<I", inner.raw, 40)[0])


def channel_state(chid: int) -> tuple[int, int]:
    """(enabled, scheduled) of the channel, from nvmock's ground truth."""
    for line in (DEBUGFS / "gpu0" / "channels").read_text().splitlines():
        f = line.split()
        if int(f[0]) == chid:
            return int(f[f.index("enabled") + 1]), int(f[f.index("scheduled") + 1])
    raise LookupError(chid)


def interleave_levels(pid: int) -> list[int]:
    """The interleave level of each of the process's TSGs on GPU 0, from nvmock's ground truth."""
    return [row["interleave"] for row in tsg_rows() if row["pid"] == pid]


def preemption_mode(tsg: int, cilp_mode: int) -> bytes:
    """GR_SET_CTXSW_PREEMPTION_MODE's parameters: the compute mode only (the CILP flag)."""
    return struct.pack("<IIIIIIQ", abi.PREEMPTION_MODE_FLAG_CILP, tsg, 0, cilp_mode, 0, 0, 0)


def levers(rm: Rm, client: int, device: int, subdevice: int) -> dict[str, object]:
    out: dict[str, object] = {}
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    channel = rm.new(client, tsg, 0xC86F, channel_params(0x100000000))
    status, token = rm.control(
        client, channel, abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, bytes(4)
    )
    assert status == 0
    chid = struct.unpack("<I", token)[0] & 0xFFFF
    preemption = abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE
    interleaved = struct.pack("<II", 0, abi.RUNLIST_SCHED_POLICY_CHANNEL_INTERLEAVED)
    high = struct.pack("<I", 2)
    calls = {
        "channel_interleave": (channel, abi.NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL, high),
        "tsg_interleave": (tsg, abi.NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, high),
        "make_realtime": (tsg, abi.NVA06C_CTRL_CMD_MAKE_REALTIME, bytes([1])),
        "restart_runlist": (channel, abi.NVA06F_CTRL_CMD_RESTART_RUNLIST, bytes([1, 0])),
        "sched_policy": (subdevice, abi.NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY, interleaved),
        # What CUDA sends while it sets up a context (CILP), and a coarser mode (CTA).
        "preempt_cilp": (subdevice, preemption, preemption_mode(tsg, 2)),
        "preempt_cta": (subdevice, preemption, preemption_mode(tsg, 1)),
        "stop_channel": (channel, abi.NVA06F_CTRL_CMD_STOP_CHANNEL, bytes([1])),
    }  # fmt: skip
    for name, (obj, cmd, params) in calls.items():
        out[name] = rm.control(client, obj, cmd, params)[0]
    out["channel_after_stop"] = list(channel_state(chid))
    out["interleave_after"] = interleave_levels(os.getpid())
    return out


def computing(rm: Rm, client: int, tsg: int, gpfifo_va: int) -> int:
    """A channel in ``tsg`` with a compute engine object on it, as CUDA makes its context's
    (HOPPER_COMPUTE_A, no parameters: gpuload's --tree cuda does the same)."""
    channel = rm.new(client, tsg, 0xC86F, channel_params(gpfifo_va))
    rm.new(client, channel, 0xCBC0)
    return channel


def dependents(rm: Rm, client: int, device: int, gpfifo_va: int) -> dict[str, object]:
    """Objects RM frees as dependents of others (kmod/nvmock/rm.c object_free()): a VA space, a
    TSG made on it whose two channels name no context share (RM's legacy mode: two shares of
    its own, SYNC then ASYNC, at the handles it picks after the TSG's graphics context, which
    takes the one after the memory allocated here with a zero handle), and a TSG not made on it
    with a share that is, two channels in that; and system memory, as libcuda's error notifier
    for each channel, which has no dependents."""
    notifier = rm.new(client, device, 0x3E, sysmem_params(4096))
    vaspace = rm.new(client, device, 0x90F1, bytes(56))
    marker = rm.alloc(client, device, 0x40, memory_params(1 << 20), handle=0).handle
    tsg = abi.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.pack(engineType=1, hVASpace=vaspace)
    legacy_tsg = rm.new(client, device, 0xA06C, tsg)
    legacy = [
        # Threads 0 and 2: thread 1 (SCG type COMPUTE1) needs runqueue 1 (rmcases.py).
        rm.new(client, legacy_tsg, 0xC86F, channel_params(gpfifo_va + n * 0x10000, flags=n << 28))
        for n in (0, 2)
    ]
    shared_tsg = rm.new(client, device, 0xA06C, tsg_params())
    ctx = abi.NV_CTXSHARE_ALLOCATION_PARAMETERS.pack(hVASpace=vaspace, flags=1)
    share = rm.new(client, shared_tsg, 0x9067, ctx)
    shared = []
    for n in (2, 3):
        params = bytearray(channel_params(gpfifo_va + n * 0x10000))
        struct.pack_into("<I", params, 24, share)  # hContextShare
        shared.append(rm.new(client, shared_tsg, 0xC86F, bytes(params)))
    return {
        "notifier": notifier,
        "vaspace": vaspace,
        "legacy_tsg": legacy_tsg,
        "graphics_context": marker + 1,
        "sync_share": marker + 2,
        "async_share": marker + 3,
        "legacy_channels": legacy,
        "shared_tsg": shared_tsg,
        "share": share,
        "shared_channels": shared,
    }


def hold(rm: Rm, client: int, device: int, subdevice: int) -> None:
    """A TSG that lives until told otherwise, and its tenant's own timeslice and preemption
    controls."""
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    print(json.dumps({"pid": os.getpid(), "client": client, "tsg": tsg}), flush=True)
    gpfifo_va = 0x100000000
    for line in sys.stdin:
        words = line.split()
        if words == ["quit"]:
            break
        if words[0] in ("compute", "context"):
            gpfifo_va += 0x10000
            target = tsg if words[0] == "compute" else rm.new(client, device, 0xA06C, tsg_params())
            channel = computing(rm, client, target, gpfifo_va)
            print(json.dumps({"tsg": target, "channel": channel}), flush=True)
            continue
        if words == ["dependents"]:
            gpfifo_va += 0x100000
            print(json.dumps(dependents(rm, client, device, gpfifo_va)), flush=True)
            continue
        if words[0] == "free":
            print(json.dumps({"status": rm.free(client, device, int(words[1]))}), flush=True)
            continue
        if words[0] == "set":
            params = struct.pack("<Q", int(words[1]))
            target = (int(words[2]), int(words[3])) if len(words) == 4 else (client, tsg)
            status = rm.control(*target, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, params)[0]
            print(json.dumps({"status": status}), flush=True)
        elif words[0] == "mode":
            preemption = abi.NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE
            params = preemption_mode(tsg, int(words[1]))
            status = rm.control(client, subdevice, preemption, params)[0]
            print(json.dumps({"status": status}), flush=True)
        elif words == ["get"]:
            status, raw = rm.control(client, tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, bytes(8))
            value = struct.unpack("<Q", raw)[0] if status == 0 else None
            print(json.dumps({"status": status, "timeslice_us": value}), flush=True)
        else:
            raise ValueError(line)


PR_SET_NAME = 15


def main(argv: list[str]) -> int:
    if argv[1:3] and argv[1] == "--comm":
        # The process's name (its main thread's), as the kernel sees it from then on.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NAME, argv[2].encode(), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME)")
        argv = [argv[0], *argv[3:]]
    rm = Rm(0)
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, DEVICE_PARAMS)
    subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
    out: dict[str, object] = {}
    if argv[0] == "vidmem":
        out["statuses"] = [
            rm.alloc(client, device, 0x40, memory_params(int(mib) << 20)).status for mib in argv[1:]
        ]
    elif argv[0] == "xfer":
        out["statuses"] = [xfer_alloc(rm, client, device, int(mib) << 20) for mib in argv[1:]]
    elif argv[0] == "guard":
        tsg = rm.new(client, device, 0xA06C, tsg_params())
        out["set_timeslice"] = rm.control(
            client, tsg, abi.NVA06C_CTRL_CMD_SET_TIMESLICE, struct.pack("<Q", 100)
        )[0]
        status, params = rm.control(client, tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, bytes(8))
        out["timeslice_us"] = struct.unpack("<Q", params)[0] if status == 0 else None
        out["schedule_enable"] = rm.control(
            client, tsg, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, bytes([1, 0, 0])
        )[0]
        out["schedule_disable"] = rm.control(
            client, tsg, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, bytes([0, 0, 0])
        )[0]
        out["preempt"] = rm.control(client, tsg, abi.NVA06C_CTRL_CMD_PREEMPT, bytes(8))[0]
        params = bytearray(536)
        struct.pack_into("<BxxxI", params, 0, 0, 0)
        out["disable_channels"] = rm.control(
            client, subdevice, abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, bytes(params)
        )[0]
    elif argv[0] == "levers":
        out = levers(rm, client, device, subdevice)
    elif argv[0] == "hold":
        hold(rm, client, device, subdevice)
    rm.free(client, client, client)
    rm.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
