"""Running tools/gpuload from the VM tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from tests.vm.nvmock import GPULOAD

READY = re.compile(
    r"gpuload: ready pid=(\d+) client=(0x[0-9a-f]+) subdevice=(0x[0-9a-f]+) "
    r"tsg=(0x[0-9a-f]+) channel=(0x[0-9a-f]+)"
)


@dataclass
class Gpuload:
    """One gpuload process; ``ready()`` waits for its handles."""

    args: list[str]
    proc: subprocess.Popen[str] = field(init=False)
    pid: int = 0
    client: int = 0
    subdevice: int = 0
    tsg: int = 0
    channel: int = 0
    cgroup: str | None = None  # a cgroup v2 directory to start it in
    nice: int = 0  # added to its nice value

    def __post_init__(self) -> None:
        cgroup, nice = self.cgroup, self.nice

        def enter() -> None:
            if nice:
                os.nice(nice)
            if cgroup is not None:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))

        self.proc = subprocess.Popen(
            [str(GPULOAD), *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=enter,
        )

    def ready(self, timeout: float = 30.0) -> Gpuload:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        said = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            said.append(line)
            if not line:
                rc = self.proc.wait()
                raise AssertionError(f"gpuload ended before it was ready: rc {rc}: {said}")
            match = READY.search(line)
            if match:
                self.pid = int(match[1])
                self.client, self.subdevice, self.tsg, self.channel = (
                    int(match[i], 16) for i in range(2, 6)
                )
                return self
        raise AssertionError("gpuload did not get ready")

    def ctl_fd(self) -> int:
        """The number of its first /dev/nvidiactl descriptor (where its client lives)."""
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{self.pid}/fd"))
        for fd in fds:
            if os.readlink(f"/proc/{self.pid}/fd/{fd}") == "/dev/nvidiactl":
                return fd
        raise AssertionError("no /dev/nvidiactl open")

    def result(self, timeout: float = 120.0) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return dict(json.loads(out))


def start_together(
    *argsets: list[str], delay: float = 1.5, cgroups: list[str] | None = None
) -> list[Gpuload]:
    start_at = time.time() + delay
    places: list[str | None] = [*cgroups] if cgroups else [None] * len(argsets)
    loads = [
        Gpuload([*args, "--start-at", f"{start_at:.3f}"], cgroup=place)
        for args, place in zip(argsets, places, strict=True)
    ]
    for load in loads:
        load.ready()
    return loads
