"""A process holding one channel made the way libcuda makes them on an H200, driven from stdin.

Its USERD is a 512-byte slot at a chosen offset in a 2 MiB video memory object of its own
(hUserdMemory[0], userdOffset[0]), which it maps through the GPU file (BAR1 under nvmock) unless
told not to; the channel itself is never mapped (RM refuses). The channel waits for
GPFIFO_SCHEDULE, which never comes, so the engine never fetches: GP_PUT and GP_GET are what the
test writes. Commands, one a line, each answered with a JSON line: ``put N`` and ``get N``
write GP_PUT and GP_GET, ``unmap`` sends RM_UNMAP_MEMORY for the mapping, ``free`` frees the
memory object, ``quit`` ends.

    python -m tests.vm.userd_tenant OFFSET [--no-map]
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys

from qpolicy.nvrm import abi
from tests.vm.rmclient import Rm, channel_params, ioctl, memory_params, tsg_params

DEVICE_PARAMS = bytes(56)
USERD_MEM = 2 << 20
DELAY_CHANNEL_SCHEDULING = 0x40
HUSERD_OFF = 32  # hUserdMemory[0] in NV_CHANNEL_ALLOC_PARAMS
USERD_OFFSET_OFF = 64  # userdOffset[0]
GP_GET = 0x88
GP_PUT = 0x8C
NVOS34 = struct.Struct("<IIIIQII")
STATUS_OFF = 24  # NVOS34.status


def unmap(rm: Rm, client: int, device: int, memory: int, linear: int) -> int:
    arg = bytearray(NVOS34.pack(client, device, memory, 0, linear, 0, 0))
    ioctl(rm.ctl, abi.Escape.RM_UNMAP_MEMORY, arg)
    return int(struct.unpack_from("<I", arg, STATUS_OFF)[0])


def main(argv: list[str]) -> int:
    offset = int(argv[0], 0)
    rm = Rm(0)
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, DEVICE_PARAMS)
    subdevice = rm.new(client, device, 0x2080, struct.pack("<I", 0))
    memory = rm.new(client, device, 0x40, memory_params(USERD_MEM))
    view: mmap.mmap | None = None
    linear = 0
    if "--no-map" not in argv:
        target = rm.open_gpu()
        status, linear = rm.map_memory(client, device, memory, USERD_MEM, target)
        assert status == abi.NvStatus.NV_OK, status
        view = mmap.mmap(target, USERD_MEM, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    params = bytearray(channel_params(0x100000000, 512, DELAY_CHANNEL_SCHEDULING))
    struct.pack_into("<I", params, HUSERD_OFF, memory)
    struct.pack_into("<Q", params, USERD_OFFSET_OFF, offset)
    channel = rm.new(client, tsg, 0xC86F, bytes(params))
    channel_map = rm.map_memory(client, subdevice, channel, 4096, rm.open_gpu())[0]
    print(
        json.dumps(
            {"pid": os.getpid(), "client": client, "channel": channel, "channel_map": channel_map}
        ),
        flush=True,
    )
    for line in sys.stdin:
        words = line.split()
        out: dict[str, int] = {}
        if words[0] in ("put", "get") and view is not None:
            where = offset + (GP_PUT if words[0] == "put" else GP_GET)
            struct.pack_into("<I", view, where, int(words[1]))
        elif words == ["unmap"]:
            out["status"] = unmap(rm, client, device, memory, linear)
        elif words == ["free"]:
            out["status"] = rm.free(client, device, memory)
        elif words == ["quit"]:
            break
        else:
            raise ValueError(line)
        print(json.dumps(out), flush=True)
    rm.free(client, client, client)
    rm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
