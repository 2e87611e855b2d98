"""A tenant process for the qgpu tests: run inside a cgroup, it issues RM calls and prints
their statuses as one JSON object.

    python -m tests.vm.tenant vidmem MIB [MIB...]   allocate device memory, in order
    python -m tests.vm.tenant xfer MIB [MIB...]     the same, each RM_ALLOC wrapped in IOCTL_XFER
    python -m tests.vm.tenant guard                 its own scheduling controls on its own TSG
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys

from qpolicy.nvrm import abi
from tests.vm.rmclient import Rm, ioctl, memory_params, tsg_params

DEVICE_PARAMS = struct.pack("<IIIIII QQQII", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def xfer_alloc(rm: Rm, client: int, device: int, size: int) -> int:
    """RM_ALLOC of device memory sent the long way: NV_ESC_IOCTL_XFER_CMD pointing at NVOS64."""
    params = ctypes.create_string_buffer(memory_params(size), 128)
    inner = ctypes.create_string_buffer(
        struct.pack(
            "<IIIIQQIIII", client, device, 0, 0x40, ctypes.addressof(params), 0, 128, 0, 0, 0
        ),
        48,
    )
    xfer = bytearray(struct.pack("<IIQ", abi.Escape.RM_ALLOC, 48, ctypes.addressof(inner)))
    ioctl(rm.ctl, abi.Escape.IOCTL_XFER_CMD, xfer)
    return int(struct.unpack_from("<I", inner.raw, 40)[0])


def main(argv: list[str]) -> int:
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
    rm.free(client, client, client)
    rm.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
