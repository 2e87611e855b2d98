"""Offline pods' compute preemption mode: the CTA strategy's second half, on tenants' contexts.

When online work arrives, GR saves the running offline context. libcuda gives every context CILP
(its own ``GR_SET_CTXSW_PREEMPTION_MODE``, mode 2, some 80 ms after creating the channels and
just before its own ``SET_TIMESLICE``: the shipped H200 trace), which saves the running thread
blocks mid-kernel: ~0.2 ms per switch on an H100 and an H200. CTA saves nothing of them but waits
for the running blocks to end. Next to a trainer of 24 µs kernels that wait is shorter than the
save: the doctor's ``cta+timeslice-1us-8ms`` gave the online stream p50 0.649 / 0.696 / 0.668 ms
against native's 0.676 / 0.725 / 0.687 and CILP's 0.676 / 0.745 / 0.691 (H100 call AA, H100
call 13A, H200 call 13B; docs/levers.md), and 0.625 against 0.647 and 0.663 on an H200 (call
29B), where ``make bench-gpu`` then measured it 0.00-0.02 ms under the pair, within noise.
Next to a trainer of 1.4 ms kernels it doubled the p50. So it is a strategy
(:mod:`~qpolicy.enforcers.strategy`) for a GPU whose offline work runs short kernels, never a
default.

The mode is the context's: on an H200, CTA set through one of a trainer's eight compute channels
was read back on all eight and turned every save of it to CTA, as the doctor's lever (a set on
every compute channel) had (tools/gpu/preemption_modes.py, call 32A; BENCHMARKS.md). So it is set
once per context, through the first compute channel of each TSG, as qgpu.ko does (until
2026-12-03 on every compute channel: eight controls of ~0.7 ms under GSP where one does). libcuda
sends its own set to the TSG's handle, which acts the same (call 32A). The mode
is set after the original is read and written to the record, and given back when the pod is
no longer offline or the enforcer lets go. libcuda's own set, which would overwrite ours, comes
just before its ``SET_TIMESLICE`` of the same context, which the probe counts per TSG: a channel
whose TSG's tenant set count has grown since ours is set again (the timeslice's race, answered
the same way). The value given back is the one read first; libcuda sets CILP, which RM answers
before its set too (every channel read on both GPUs: CILP).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from qpolicy.enforcers.rm.files import BorrowedFiles
from qpolicy.enforcers.rm.record import RmRecord
from qpolicy.enforcers.rm.resolver import PodResolver
from qpolicy.nvrm import abi, rmctl
from qpolicy.nvrm.tracker import ClientChannels
from qpolicy.runtime.worker import Worker

log = logging.getLogger(__name__)

# A compute channel is named by its process, client and handle.
ChannelKey = tuple[int, int, int]


class PreemptionModes:
    """The compute preemption mode of the pods it is asked to set, on their compute channels."""

    def __init__(
        self,
        resolver: PodResolver,
        files: BorrowedFiles,
        record: RmRecord,
        worker: Worker,
        complain: Callable[[str, str], None],
    ) -> None:
        self.resolver = resolver
        self.files = files
        self.record = record
        self.worker = worker
        self.complain = complain
        # Shared by the loop thread (which builds the jobs) and the worker (which sends them).
        self._lock = threading.Lock()
        self._wanted: dict[str, int] = {}
        # Per channel set: the tenant's set count of its TSG when it was set.
        self._sent: dict[ChannelKey, int] = {}
        # Per channel: the mode to give back; per pod, the channels changed, with the fd and
        # subdevice they are reached on.
        self._original: dict[ChannelKey, int] = {}
        self._changed: dict[str, dict[ChannelKey, tuple[int, int]]] = {}

    def wanted(self) -> dict[str, str]:
        """The pods given a mode, with its name (for the status)."""
        return {p: abi.PREEMPTION_MODE_COMPUTE.get(m, str(m)) for p, m in self._wanted.items()}

    def pods(self) -> set[str]:
        """The pods given a mode, and those with channels changed still to give back (a set
        that was queued before the pod let go is carried out after it)."""
        with self._lock:
            return set(self._wanted) | {pod for pod, changed in self._changed.items() if changed}

    def set_mode(self, pod: str, mode: int | None) -> None:
        """Give the pod's contexts ``mode`` (None: their own again), now and as they appear:
        called every period, it sets channels made since and those whose tenant set its own."""
        if mode is None:
            if self._wanted.pop(pod, None) is not None or pod in self._changed:
                self._restore(pod)
            return
        if self._wanted.get(pod) != mode:
            self._wanted[pod] = mode
            with self._lock:  # a new mode goes to every channel again
                for key in self._changed.get(pod, {}):
                    self._sent.pop(key, None)
        self._send(pod, mode)

    def release(self) -> None:
        """Give every pod's contexts their own modes back (queued controls)."""
        for pod in self.pods():
            self.set_mode(pod, None)

    def forget(self, pid: int) -> None:
        """Drop what is kept about the channels of a process that exited."""
        with self._lock:
            for table in (self._sent, self._original):
                for key in [k for k in table if k[0] == pid]:
                    del table[key]
            for changed in self._changed.values():
                for key in [k for k in changed if k[0] == pid]:
                    del changed[key]

    def _send(self, pod: str, mode: int) -> None:
        todo: list[tuple[ClientChannels, int]] = []
        with self._lock:
            for group in self.resolver.groups(pod):
                if not group.pid or group.fd is None or group.subdevice is None:
                    continue
                contexts: set[int] = set()
                for channel, tsg in group.compute_channels:
                    if tsg is not None:  # one control per context (its first compute channel)
                        if tsg in contexts:
                            continue
                        contexts.add(tsg)
                    key = (group.pid, group.client, channel)
                    tenant_sets = group.tenant_sets(tsg) if tsg is not None else 0
                    sent = self._sent.get(key)
                    if sent is not None and sent >= tenant_sets:
                        continue
                    self._sent[key] = tenant_sets
                    todo.append((group, channel))
        if not todo:
            return

        def job() -> float:
            calls = 0
            for group, channel in todo:
                assert group.pid is not None and group.fd is not None
                assert group.subdevice is not None
                key = (group.pid, group.client, channel)
                try:
                    fd = self.files.get(group.pid, group.fd)
                    with self._lock:
                        original = self._original.get(key)
                    if original is None:
                        result, original = rmctl.get_compute_preemption(
                            fd, group.client, group.subdevice, channel
                        )
                        calls += 1
                        if not result.ok:
                            self.complain(pod, f"GR_GET_CTXSW_MODES answered {result.status:#x}")
                            continue
                        # Written down before it is changed, as a timeslice is.
                        self.record.preemption_changed(
                            group.pid, group.fd, group.client, group.subdevice, channel, original
                        )
                        with self._lock:
                            self._original[key] = original
                    with self._lock:
                        self._changed.setdefault(pod, {})[key] = (group.fd, group.subdevice)
                    result = rmctl.set_compute_preemption(
                        fd, group.client, group.subdevice, channel, mode
                    )
                    calls += 1
                    if not result.ok:
                        self.complain(
                            pod, f"GR_SET_CTXSW_PREEMPTION_MODE answered {result.status:#x}"
                        )
                    log.debug(
                        "pod %s: compute preemption %s on channel %#x of pid %d: %#x",
                        pod,
                        abi.PREEMPTION_MODE_COMPUTE.get(mode, str(mode)),
                        channel,
                        group.pid,
                        result.status,
                    )
                except rmctl.RmError as error:
                    self.complain(pod, str(error))
            return float(calls)

        self.worker.submit(job)

    def _restore(self, pod: str) -> None:
        """Give every channel changed for ``pod`` its own mode back, resolved or not."""
        with self._lock:
            changed = self._changed.pop(pod, {})
            todo = [
                (key, fd, subdevice, self._original[key])
                for key, (fd, subdevice) in changed.items()
                if key in self._original
            ]
            for key in changed:
                self._sent.pop(key, None)
        if not todo:
            return

        def job() -> float:
            calls = 0
            for (pid, client, channel), tenant_fd, subdevice, original in todo:
                try:
                    fd = self.files.get(pid, tenant_fd)
                    result = rmctl.set_compute_preemption(fd, client, subdevice, channel, original)
                    calls += 1
                except rmctl.RmError as error:
                    self.complain(pod, str(error))
                    continue
                if result.ok:
                    self.record.preemption_restored(pid, client, channel)
                    with self._lock:
                        self._original.pop((pid, client, channel), None)
                else:
                    self.complain(pod, f"GR_SET_CTXSW_PREEMPTION_MODE answered {result.status:#x}")
            return float(calls)

        self.worker.submit(job)
