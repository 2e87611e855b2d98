"""A stand-in for the daemon that the OOM killer takes: it joins a cgroup, starts the real
guard, closes a gpuload's channel the way the rm enforcer does (record written first), says so
on stdout, then allocates memory until its cgroup's limit kills it.

    python -m tests.vm.oomdaemon CGROUP STATE_DIR PID FD CLIENT SUBDEVICE CHANNEL

Also started in the cgroup: a ``sleep``, a process at the default OOM setting, whose death
shows that the kill took the whole group, not just the process that allocated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from qpolicy.enforcers.rm.guard import Guard
from qpolicy.enforcers.rm.record import RECORD_NAME, RmRecord
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.tracker import ClientChannels


def main(argv: list[str]) -> int:
    cgroup, state_dir = Path(argv[0]), Path(argv[1])
    pid, fd, client, subdevice, channel = (int(a, 0) for a in argv[2:7])
    # First into the cgroup: the guard and the sleeper, started below, inherit it.
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    sleeper = subprocess.Popen(["sleep", "600"])
    guard = Guard(state_dir)
    assert guard.process is not None
    # A daemon meets its OOM long after its guard started; this one would meet it at once.
    adj = Path(f"/proc/{guard.process.pid}/oom_score_adj")
    deadline = time.monotonic() + 60
    while adj.read_text().strip() != "-1000":
        if time.monotonic() > deadline:
            print(f"the guard never set oom_score_adj: {adj.read_text().strip()}", flush=True)
            return 3
        time.sleep(0.05)
    group = ClientChannels(
        pid=pid,
        cgroup=None,
        fd=fd,
        client=client,
        subdevice=subdevice,
        channels=(channel,),
        tsgs=(),
    )
    RmRecord(state_dir / RECORD_NAME).closing(group)
    own = rmctl.borrow_fd(pid, fd)
    result = rmctl.disable_channels(own, client, subdevice, [channel], disable=True)
    os.close(own)
    print(f"closed ok={result.ok} guard={guard.process.pid} sleeper={sleeper.pid}", flush=True)
    hoard = []
    while True:  # until the cgroup's OOM kill
        chunk = bytearray(1 << 20)
        chunk[::4096] = b"x" * len(chunk[::4096])
        hoard.append(chunk)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
