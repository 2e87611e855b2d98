"""The rm enforcer: qpolicy's periods on a real GPU, through RM controls sent from userspace.

For hosts that cannot load an unsigned kernel module (docs/gpu-measurements.md). The eBPF
probe's tracker knows each process's RM clients, their subdevices, TSGs and channels per GPU and
the fd each client lives on; the enforcer takes that fd with ``pidfd_getfd`` and sends, on the
tenant's own objects:

* ``FIFO_DISABLE_CHANNELS`` to close and open a pod's channels at turn boundaries (the one lever
  measured to stop a process on a GSP GPU), break before make, so turns never overlap and a pod's
  GPU time is the time its channels were open;
* ``SET_TIMESLICE`` to give online pods a long timeslice and offline pods a short one;
* ``GR_SET_CTXSW_PREEMPTION_MODE`` CTA on offline pods' contexts, where the GPU's strategy says
  its offline work runs short kernels (:mod:`~.preemption`).

What it cannot do, by construction: a tenant may send the same controls itself and re-open its own
channels; device memory cannot be limited (nothing stands between RM_ALLOC and the driver); timing
comes from a userspace thread, so a switch costs about a control (~0.6 ms) of idle GPU; an online
pod's GPU time is not measured (its channels stay open while offline pods run); and processes that
started before the first daemon's probe was loaded are not seen (their RM handles were never
observed; a restarted daemon adopts what its predecessor saw: :mod:`~.handles`). The kernel module
removes all of these.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from qpolicy.enforcer import PodUsage
from qpolicy.enforcers.rm.control import RmChannelControl
from qpolicy.enforcers.rm.files import BorrowedFiles
from qpolicy.enforcers.rm.record import RECORD_NAME, RmRecord
from qpolicy.enforcers.rm.resolver import GpuLocator, PodResolver
from qpolicy.enforcers.rm.sensor import RmUsageSensor
from qpolicy.enforcers.slicer import SliceScheduler
from qpolicy.enforcers.strategy import DEFAULT, OnlineStrategy
from qpolicy.engine import Plan
from qpolicy.model import PodClass
from qpolicy.runtime.clock import Loop, Repeating
from qpolicy.runtime.worker import ControlWorker, Worker
from qpolicy.telemetry.gpus import GpuInfo, node_gpus

log = logging.getLogger(__name__)


class RmShared:
    """What the rm enforcers of a node's GPUs share: one control thread, the borrowed
    descriptors and the record of closed channels."""

    def __init__(
        self,
        loop: Loop,
        state_dir: Path,
        worker: Worker | None = None,
        files: BorrowedFiles | None = None,
        gpus: Callable[[], Sequence[GpuInfo]] = node_gpus,
    ) -> None:
        self.loop = loop
        self.worker = worker if worker is not None else ControlWorker(loop)
        self.files = files if files is not None else BorrowedFiles()
        self.record = RmRecord(state_dir / RECORD_NAME)
        self.locator = GpuLocator(self.files, gpus)
        self.controls: list[RmChannelControl] = []

    def forget(self, pid: int) -> None:
        """A process exited: close its borrowed descriptors, drop what was kept about it."""
        self.files.forget(pid)
        self.locator.forget(pid)
        self.record.forget(pid)
        for control in self.controls:
            control.forget(pid)

    def reconcile(self) -> None:
        """Let go of descriptors whose process or file is gone, and of what was kept about
        processes that exited, whether or not the probe saw the exit (its events can be lost)."""
        for pid in self.files.reconcile():
            self.forget(pid)

    def close(self) -> None:
        if not self.worker.drain():
            log.warning("controls still queued at shutdown; %s keeps the record", self.record.path)
        self.worker.close()
        self.files.close_all()


class RmEnforcer:
    """The Enforcer interface over the slice scheduler, the RM controls and the probe."""

    name = "rm"

    def __init__(
        self,
        shared: RmShared,
        resolver: PodResolver,
        *,
        idle_grace_us: float = 50_000.0,
        watch_us: float = 25_000.0,
        fixed_poll_us: float | None = None,
        strategy: OnlineStrategy = DEFAULT,
    ) -> None:
        """``watch_us`` is how often pods that may wake up outside a turn are looked at (an idle
        pod left open, an idle GPU a work-conserving policy may hand out); a busy pod holding the
        GPU is looked at once per ``idle_grace_us``, and a turn's end is a timer.

        ``fixed_poll_us`` is the loop before 2026-11-25, kept for ``make bench daemon`` to measure
        against: the sensor polled and the turns looked at every ``fixed_poll_us``, whatever
        could change.
        """
        self.loop = shared.loop
        self.strategy = strategy
        self.shared = shared
        self.control = RmChannelControl(
            shared.loop, resolver, shared.files, shared.record, shared.worker
        )
        shared.controls.append(self.control)
        self.sensor = RmUsageSensor(self.control, resolver, idle_grace_us)
        self.scheduler = SliceScheduler(
            shared.loop,
            self.control,
            self.sensor,
            idle_grace_us=idle_grace_us,
            # Polled on a fixed grid, the sensor is followed by a look at the turns (observe),
            # and the scheduler needs no timer of its own but for the turns' ends.
            poll_us=math.inf if fixed_poll_us is not None else watch_us,
            handover="break-before-make",
        )
        self._poller: Repeating | None = None
        self._applied: Plan | None = None  # the plan of the running period, as adjusted
        if fixed_poll_us is not None:
            self._poller = shared.loop.every(fixed_poll_us, self._poll)
        else:
            # The scheduler wakes only when a turn can end or a pod can change; the launch
            # counters are read then, not on a grid.
            self.scheduler.refresh = self.sensor.poll
            self.scheduler.sensor_due = self.sensor.look_due_at

    def _poll(self) -> None:
        self.sensor.poll()
        self.scheduler.observe()

    def collect(self) -> Mapping[str, PodUsage]:
        if self._poller is None:
            self.sensor.poll()  # the period's last look: whether each pod still has work
        usage = self.scheduler.collect()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "period used %s",
                ", ".join(
                    f"{pod} {u.used_us / 1000:.1f} ms{' hungry' if u.hungry else ''}"
                    for pod, u in usage.items()
                ),
            )
        return usage

    def apply(self, plan: Plan) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "plan %s",
                ", ".join(f"{s.pod} {s.allocation:.3f}" for s in plan.slices),
            )
        adjusted = self.strategy.adjust(plan)
        self.scheduler.apply(adjusted)
        self._applied = adjusted
        self.follow_processes()

    def follow_processes(self) -> None:
        """Give TSGs and contexts made since the plan was applied (and those whose tenant set
        its own since) what the plan wants them to have: the period's start does, and the
        backend asks again when the tracker moves."""
        if self._applied is None:
            return
        self.control.refresh_timeslices()
        self._set_preemption(self._applied)

    def _set_preemption(self, plan: Plan) -> None:
        """The strategy's compute preemption mode on offline pods given their class's timeslice
        (there is online work on the GPU to switch to); every other pod's contexts their own."""
        modes = self.control.preemption
        mode = self.strategy.offline_preemption
        wanted = {
            s.pod: mode
            if mode is not None and s.pod_class is PodClass.OFFLINE and s.timeslice_us is not None
            else None
            for s in plan.slices
        }
        for pod in modes.pods() - set(wanted):
            modes.set_mode(pod, None)
        for pod, value in wanted.items():
            modes.set_mode(pod, value)

    def stand_down(self) -> None:
        """Open every pod and restore timeslices, and keep watching for the next plan."""
        self._applied = None  # nothing to follow until then
        self.scheduler.release()
        self.control.preemption.release()

    def release(self) -> None:
        """Open every channel this enforcer closed and restore timeslices (queued controls)."""
        if self._poller is not None:
            self._poller.cancel()
        self._applied = None
        self.scheduler.release()
        self.control.preemption.release()
        if self.control in self.shared.controls:
            self.shared.controls.remove(self.control)
