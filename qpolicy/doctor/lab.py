"""The doctor's workloads and their RM objects: processes started, watched, and reached.

A :class:`Workload` is one process of :mod:`qpolicy.doctor.workload`; a thread reads its JSON lines
into lists the doctor slices by time. The RM handles of its client, TSGs and channels come from the
eBPF probe's tracker, as the rm enforcer learns tenants' handles; the doctor's controls go over a
descriptor borrowed from the process (``pidfd_getfd``), on the process's own objects, exactly as the
rm enforcer sends them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from qpolicy.errors import QPolicyError
from qpolicy.nvrm import rmctl
from qpolicy.nvrm.fecs import Request
from qpolicy.nvrm.tracker import ClientChannels, Tracker

# GR_GET_CTXSW_STATS' counters, and the names the doctor gives them (Lab.saves).
SAVE_KINDS = (
    ("saveCnt", "all"),
    ("wfiSaveCnt", "wfi"),
    ("ctaSaveCnt", "cta"),
    ("cilpSaveCnt", "cilp"),
)


class Handles(Protocol):
    """Where RM handles come from: the probe's tracker, refreshed on demand."""

    @property
    def tracker(self) -> Tracker: ...

    def refresh(self) -> None: ...


class Borrow(Protocol):
    def get(self, pid: int, fd: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Call:
    """One control the doctor sent, and what RM made of it."""

    control: str
    target: str
    status: int
    us: float
    answer: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "control": self.control,
            "target": self.target,
            "status": f"{self.status:#x}",
            "us": round(self.us, 1),
        }
        if self.answer:
            out["answer"] = dict(self.answer)
        return out


class Workload:
    """One workload process and what it has printed so far."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        on_ask: Callable[[], None] = lambda: None,
        on_result: Callable[[], None] = lambda: None,
    ) -> None:
        self.env = dict(env)
        self.proc = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.ready = threading.Event()
        self.samples: list[tuple[float, float]] = []  # (wall time, latency ms or matmuls done)
        # The online stream's requests: (wall time, the request on CLOCK_MONOTONIC_RAW).
        self.launches: list[tuple[float, Request]] = []
        self._on_ask = on_ask
        self._on_result = on_result
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "ready" in event:
                self.ready.set()
            elif "ask" in event:
                self._on_ask()
                self.send("go")
            elif "ms" in event:
                with self._lock:
                    self.samples.append((float(event["t"]), float(event["ms"])))
                    if "launch" in event:
                        enqueued = event.get("enqueued")
                        request = Request(
                            int(event["launch"]),
                            int(event["done"]),
                            None if enqueued is None else int(enqueued),
                        )
                        self.launches.append((float(event["t"]), request))
                self._on_result()
            elif "done" in event:
                with self._lock:
                    self.samples.append((float(event["t"]), float(event["done"])))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it exited; its reader ends too

    def between(self, start: float, end: float) -> list[tuple[float, float]]:
        with self._lock:
            return [s for s in self.samples if start <= s[0] < end]

    def launched_between(self, start: float, end: float) -> list[Request]:
        """The requests that arrived in the window, on CLOCK_MONOTONIC_RAW."""
        with self._lock:
            return [request for t, request in self.launches if start <= t < end]

    def wait_ready(self, timeout_s: float) -> None:
        if not self.ready.wait(timeout_s):
            err = ""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read()[-800:]
            raise QPolicyError(f"a doctor workload did not start within {timeout_s:.0f} s: {err}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def workload_argv(kind: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "qpolicy.doctor.workload", kind, *args]


class Lab:
    """The running workloads of one doctor run, their objects, and the controls sent to them."""

    def __init__(
        self,
        gpu: int,
        handles: Handles,
        files: Borrow,
        send: Callable[..., Any] = rmctl.control,
    ) -> None:
        self.gpu = gpu
        self.handles = handles
        self.files = files
        self._send = send  # rmctl.control, replaced in tests
        self.env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        self.online: Workload | None = None
        self.trainer: Workload | None = None
        #: Called on the reader thread before each online request is released, and once its
        #: result is back (a per-request lever).
        self.before_request: Callable[[], None] | None = None
        self.after_request: Callable[[], None] | None = None

    # -- workloads --------------------------------------------------------------------------------

    def start_online(self, n: int, hz: float, timeout_s: float = 120.0) -> Workload:
        self.online = Workload(
            workload_argv("online", "--n", str(n), "--hz", str(hz)),
            self.env,
            self._ask,
            self._result,
        )
        self.online.wait_ready(timeout_s)
        return self.online

    def start_trainer(self, n: int, *, wait: bool = False, timeout_s: float = 120.0) -> Workload:
        argv = workload_argv("trainer", "--n", str(n), *(["--wait"] if wait else []))
        self.trainer = Workload(argv, self.env)
        self.trainer.wait_ready(timeout_s)
        return self.trainer

    def _ask(self) -> None:
        hook = self.before_request
        if hook is not None:
            hook()

    def _result(self) -> None:
        hook = self.after_request
        if hook is not None:
            hook()

    def stop(self) -> None:
        for workload in (self.online, self.trainer):
            if workload is not None:
                workload.stop()

    # -- objects ----------------------------------------------------------------------------------

    def groups(self, workload: Workload, timeout_s: float = 10.0) -> list[ClientChannels]:
        """The workload's channel groups, once the probe has seen them (TSGs included)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.handles.refresh()
            found = [
                g
                for g in self.handles.tracker.channel_groups(workload.pid)
                if g.subdevice is not None and g.fd is not None and g.tsgs
            ]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not found:
            raise QPolicyError(
                f"the probe saw no channels of workload pid {workload.pid}: is the eBPF probe "
                "watching this GPU's device files?"
            )
        return found

    def saves(self, group: ClientChannels, tsg: int, target: str) -> dict[str, int] | None:
        """``tsg``'s context saves by kind (GR_GET_CTXSW_STATS on ``group``'s subdevice), named
        as the doctor reports them; None where RM refused the read."""
        from qpolicy.nvrm import abi

        assert group.subdevice is not None
        call = self.control(
            group, target, group.subdevice, abi.NV2080_CTRL_CMD_GR_GET_CTXSW_STATS, hChannel=tsg
        )
        if call.status != 0:
            return None
        return {name: call.answer.get(key, 0) for key, name in SAVE_KINDS}

    def control(
        self, group: ClientChannels, target: str, obj: int, cmd: int, **fields: int
    ) -> Call:
        """Send ``cmd`` to ``obj`` of ``group``'s client, over its own descriptor."""
        from qpolicy.nvrm import abi

        assert group.pid is not None and group.fd is not None
        fd = self.files.get(group.pid, group.fd)
        result, answer = self._send(fd, group.client, obj, cmd, **fields)
        return Call(abi.control_name(cmd), target, result.status, result.duration_ns / 1000, answer)
