#!/usr/bin/env python3
"""A control for the VM tier, with no qgpu involved: switch the kernel's own function tracer on
and off nvmock_ioctl while gpuload calls it without pause, and print each switch.

    tools/vm/run env PYTHONPATH=. .venv/bin/python tools/vm/ftrace_control.py [N]
    VM_QEMU_OPTS="-accel tcg,thread=single" tools/vm/run env PYTHONPATH=. ...

On QEMU's multi-threaded TCG this stops within a few dozen switches (2026-11-21: after 6): the
vCPU running gpuload spins at nvmock_ioctl+0 while the memory there already holds the patched
instruction, and the next ftrace update waits for it forever. On single-threaded TCG 300
switches pass. qgpu's load/unload tests run there for that reason (Makefile, vm-test).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.vm.gpuload import Gpuload
from tests.vm.nvmock import GPUS, load, make_nodes

TRACING = Path("/sys/kernel/tracing")
SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]
STREAM = [*SATURATE, "--steps", "100000", "--vidmem-mib", "1", "--seconds", "0.2"]


def main() -> None:
    switches = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    subprocess.run(["mount", "-t", "tracefs", "none", str(TRACING)], check=False)
    load(num_gpus=GPUS)
    make_nodes()
    runners = [Gpuload([*SATURATE, "--seconds", "100000", "--gpu", str(g)]) for g in range(2)]
    streamer = Gpuload(STREAM)
    for switch in range(switches):
        started = time.monotonic()
        (TRACING / "set_ftrace_filter").write_text("nvmock_ioctl\n")
        (TRACING / "current_tracer").write_text("function\n")
        time.sleep(0.05)
        (TRACING / "current_tracer").write_text("nop\n")
        print(f"switch {switch}: {time.monotonic() - started:.2f} s", flush=True)
        if streamer.proc.poll() is not None:
            streamer = Gpuload(STREAM)
    for load_ in [*runners, streamer]:
        load_.proc.kill()
    print(f"{switches} switches done", flush=True)


if __name__ == "__main__":
    main()
