"""A long-lived tenant for the qgpu cgroup and unload tests: one RM client (device, subdevice,
TSG) made at start, then commands from stdin, one a line, each answered with one JSON line.

    alloc MIB         device memory under the device: {"status": RM's status}
    move PATH         write its own pid into PATH/cgroup.procs (a cgroup v2 directory)
    deny N            N GPFIFO_SCHEDULE(disable) controls on its TSG, which the tenant guard
                      refuses in a gated cgroup: {"statuses": {status: count}}
    channels N        N more channels (never mapped, so the scheduler counts them busy), in
                      TSGs of up to 64: {"channels": total}
    quit              exits, freeing nothing (its fds close)

It prints {"pid", "client", "tsg"} once ready. :class:`Worker` starts one in a cgroup and
talks to it.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections import Counter
from pathlib import Path

from qpolicy.nvrm import abi
from tests.vm.linetenant import LineTenant
from tests.vm.rmclient import Rm, channel_params, memory_params, tsg_params
from tests.vm.tenant import DEVICE_PARAMS

ROOT = Path(__file__).resolve().parents[2]

CHANNELS_PER_TSG = 64


def main() -> int:
    rm = Rm(0)
    client = rm.new(0, 0, 0x41)
    device = rm.new(client, client, 0x80, DEVICE_PARAMS)
    rm.new(client, device, 0x2080, struct.pack("<I", 0))
    tsg = rm.new(client, device, 0xA06C, tsg_params())
    channels: list[int] = []
    group = tsg
    print(json.dumps({"pid": os.getpid(), "client": client, "tsg": tsg}), flush=True)
    for line in sys.stdin:
        word, *args = line.split()
        answer: dict[str, object]
        if word == "alloc":
            params = memory_params(int(args[0]) << 20)
            answer = {"status": rm.alloc(client, device, 0x40, params).status}
        elif word == "move":
            with open(os.path.join(args[0], "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
            answer = {"moved": args[0]}
        elif word == "deny":
            statuses: Counter[int] = Counter()
            for _ in range(int(args[0])):
                status = rm.control(
                    client, tsg, abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, bytes([0, 0, 0])
                )[0]
                statuses[status] += 1
            answer = {"statuses": {str(k): v for k, v in statuses.items()}}
        elif word == "channels":
            for _ in range(int(args[0])):
                if len(channels) % CHANNELS_PER_TSG == 0 and channels:
                    group = rm.new(client, device, 0xA06C, tsg_params())
                va = (1 << 32) + len(channels) * (1 << 20)
                channels.append(rm.new(client, group, 0xC86F, channel_params(va)))
            answer = {"channels": len(channels)}
        elif word == "quit":
            return 0
        else:
            raise ValueError(line)
        print(json.dumps(answer), flush=True)
    return 0


class Worker(LineTenant):
    """This module run as a process placed in the cgroup directory ``cgroup``."""

    def __init__(self, cgroup: Path) -> None:
        super().__init__(cgroup, "tests.vm.worker", timeout=60.0)
        self.pid, self.client, self.tsg = self.hello["pid"], self.hello["client"], self.hello["tsg"]

    def alloc(self, mib: int) -> int:
        return int(self.ask(f"alloc {mib}")["status"])

    def deny(self, n: int) -> dict[int, int]:
        return {int(k): v for k, v in self.ask(f"deny {n}")["statuses"].items()}


if __name__ == "__main__":
    sys.exit(main())
