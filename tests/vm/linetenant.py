"""A helper process of the VM tests, started in a cgroup v2 directory, that answers each line on
its stdin with one JSON line on its stdout and says hello with one first (tests/vm/tenant.py
``hold``, tests/vm/worker.py, tests/vm/memtenant.py). The classes that drive each of them build
on this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

from tests.vm.nvmock import ROOT


class LineTenant:
    """``python -m module *args`` as a process placed in ``cgroup``; ``hello`` is its first
    answer. ``close()`` says quit and requires exit status 0 within ``timeout`` seconds."""

    def __init__(self, cgroup: Path, module: str, *args: str, timeout: float = 30.0) -> None:
        def enter() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        self.timeout = timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=enter,
        )
        self.hello = self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the tenant ended: rc {self.proc.wait()}"
        return dict(json.loads(line))

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            with suppress(BrokenPipeError):
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
        with suppress(BrokenPipeError):
            self.proc.stdin.close()
        self.proc.wait(timeout=self.timeout)
        self.proc.stdout.close()
        assert self.proc.returncode == 0, f"the tenant ended with rc {self.proc.returncode}"
