"""``--enforcer rm``: a control loop per GPU on the daemon's loop, gating channels from userspace.

Start-up order matters: what a previous daemon left changed (closed channels, set timeslices) is
undone first (:func:`~qpolicy.enforcers.rm.record.recover`), before anything is sent; then the
processes it knew are adopted (:func:`~qpolicy.enforcers.rm.handles.adopt`), before the probe's
first events are fed, so that pods that started before this daemon stay governed; processes no
daemon saw are searched for in RM (:mod:`~qpolicy.enforcers.rm.unseen`). Each GPU with
pods then gets its own :class:`~qpolicy.control.ControlLoop` over an
:class:`~qpolicy.enforcers.rm.enforcer.RmEnforcer`; all of them share one control thread, the
borrowed descriptors and the record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpolicy.backends.base import BackendContext
from qpolicy.control import ControlLoop, PeriodicControl
from qpolicy.enforcers.rm.enforcer import RmEnforcer, RmShared
from qpolicy.enforcers.rm.files import BorrowedFiles
from qpolicy.enforcers.rm.guard import CHECK_EVERY_S, Guard, start_guard
from qpolicy.enforcers.rm.handles import HANDLES_NAME, HandleBook, adopt
from qpolicy.enforcers.rm.record import Recovery, recover
from qpolicy.enforcers.rm.resolver import ProbeResolver
from qpolicy.enforcers.rm.unseen import UnseenProcesses
from qpolicy.enforcers.strategy import strategy_for
from qpolicy.errors import QPolicyError
from qpolicy.model import PodIdKind, PodSpec, pod_id_kind
from qpolicy.nvrm.discover import AskerFactory
from qpolicy.nvrm.tracker import Tracker
from qpolicy.runtime.worker import Worker
from qpolicy.state import DesiredState
from qpolicy.telemetry.cgroups import cgroup_of_process
from qpolicy.telemetry.gpus import GpuInfo, node_gpus
from qpolicy.telemetry.view import Enforcement, NodeView

log = logging.getLogger(__name__)

# How often borrowed descriptors are checked against their processes and files.
RECONCILE_EVERY_S = 1.0
# The share of the daemon's time RM is asked for such processes' handles while a search runs
# (5 % of a core), given at each refresh for the time since the last, and at most
# SEARCH_MOST_S at once. A fixed 5 ms a refresh took 8-10 % of a core while searching (an H200,
# call 24E): a refresh is due every 0.1 s tick but runs with whatever wakes the loop in the last
# half of that, and a slice looked at the clock only every 64 controls. A
# CUDA process took ~4 700 controls of 5-9 us to its channels (calls 23E-F): found in about a
# second; each client handle made after it adds a check of 15 us (a held one: 3 us and a
# control per control descriptor; 30 000 clients: 13.5 s, call 24E).
SEARCH_SHARE = 0.05
SEARCH_MOST_S = 0.01
TICK_S = 0.1


@dataclass
class _Gpu:
    periodic: PeriodicControl
    enforcer: RmEnforcer


#: The shortest turn an offline pod gets when pods take turns (the period is stretched to fit).
#: Each hand-over is two GSP controls, ~0.8 ms of the daemon's CPU each on H100 and H200
#: (BENCHMARKS.md, 2026-11-26): at 400 ms turns that is ~0.4 % of a core whatever the number of
#: pods, at 200 ms ~0.8 %. The price: a pod waits (pods - 1) x 400 ms between turns, and a pod
#: that wakes while a repeating plan runs may wait up to one turn for the GPU.
DEFAULT_MIN_TURN_MS = 400.0


def tracker_changes(
    tracker: Tracker, path_of: Callable[[int], str | None], busiest: int = 16
) -> dict[str, Any]:
    """What changed the tracker so far, by cause, and the cgroups whose processes changed it
    most (by path where known, else the id; None: not known): on a node whose pods are steady,
    what keeps the daemon rebuilding its summaries and rewriting its handle file."""
    return {
        "by_cause": dict(tracker.changes),
        "busiest": [
            {"cgroup": None if cgid is None else path_of(cgid) or str(cgid), "changes": count}
            for cgid, count in tracker.changes_by_cgroup.most_common(busiest)
        ],
    }


class RmBackendFactory:
    """Makes the rm backend once the daemon has its probe; :meth:`prepare` first undoes what a
    previous daemon left changed, before the probe is loaded: a pod that daemon closed waits for
    this, and the probe's compile and attach took 1.5-2 s of the 3.4-4.2 s such a pod stood
    after a SIGKILL on an H200 (BENCHMARKS.md, 2026-12-01)."""

    def __init__(
        self,
        min_turn_ms: float = DEFAULT_MIN_TURN_MS,
        *,
        guard: Callable[[Path], Guard | None] | None = start_guard,
    ) -> None:
        self.min_turn_ms = min_turn_ms
        self._recovery: Recovery | None = None
        self._start_guard = guard
        self._guard: Guard | None = None

    def prepare(self, state_dir: Path) -> None:
        """Called with the node's lock held, before the probe loads. The guard (which undoes
        what this daemon changes if it is killed) starts once the last daemon's changes are
        undone, before this one changes anything."""
        state_dir.mkdir(parents=True, exist_ok=True)
        self._recovery = recover(state_dir)
        if self._start_guard is not None:
            self._guard = self._start_guard(state_dir)

    def __call__(self, context: BackendContext) -> RmBackend:
        return RmBackend(
            context, min_turn_ms=self.min_turn_ms, recovery=self._recovery, guard=self._guard
        )


class RmBackend:
    kind = "rm"

    def __init__(
        self,
        context: BackendContext,
        *,
        min_turn_ms: float = DEFAULT_MIN_TURN_MS,
        worker: Worker | None = None,
        files: BorrowedFiles | None = None,
        gpus: Callable[[], Sequence[GpuInfo]] = node_gpus,
        recovery: Recovery | None = None,
        askers: AskerFactory | None = None,
        guard: Guard | None = None,
    ) -> None:
        if context.probe is None:
            raise QPolicyError(
                "the rm enforcer needs the eBPF probe: it learns each process's RM handles from "
                "its driver traffic"
            )
        self.context = context
        self.probe = context.probe
        self.min_turn_us = min_turn_ms * 1000 or None
        context.state_dir.mkdir(parents=True, exist_ok=True)
        # Before anything else is sent: a daemon killed mid-period left pods closed. The daemon
        # recovers before it loads the probe (RmBackendFactory.prepare) and hands the result in;
        # a backend made otherwise (tests, tools) recovers here.
        self.recovery = recovery if recovery is not None else recover(context.state_dir)
        if self.recovery.opened or self.recovery.restored or self.recovery.modes:
            log.info(
                "re-opened %d channel group(s), restored %d timeslice(s) and %d preemption "
                "mode(s) a previous daemon left changed",
                self.recovery.opened,
                self.recovery.restored,
                self.recovery.modes,
            )
        for problem in self.recovery.problems:
            log.warning("could not undo what a previous daemon changed: %s", problem)
        tracker = self.probe.view.tracker
        self.adoption = adopt(context.state_dir, tracker, self._cgroup_of)
        if self.adoption.processes or self.adoption.dropped:
            log.info(
                "adopted %d process(es) a previous daemon knew (%d channels, %d RM objects; "
                "%d objects RM no longer holds dropped)",
                self.adoption.processes,
                self.adoption.channels,
                self.adoption.objects,
                self.adoption.dropped,
            )
        for problem in self.adoption.problems:
            log.warning("could not adopt what a previous daemon knew: %s", problem)
        self.guard = guard
        self._guard_checked_at = context.clock()
        self.shared = RmShared(context.loop, context.state_dir, worker, files, gpus)
        self.probe.on_exit.append(self.shared.forget)
        self._state = DesiredState()
        self._gpus: dict[int, _Gpu] = {}
        self._reconciled_at = context.clock()
        self._advanced_at: float | None = None
        # The tracker's generation the levers last followed (refresh()).
        self._followed = -1
        self.unseen_processes = UnseenProcesses(
            lambda: self.probe.view.tracker,
            context.cgroup_root,
            self._cgroup_of,
            context.clock,
            askers=askers,
        )
        # Clients made after the previous daemon's mark are what a search of RM asks about; it
        # is written on until this daemon has searched them (UnseenProcesses.mark_to_write).
        self.unseen_processes.mark = self.adoption.newest_client
        self.handles = HandleBook(
            context.state_dir / HANDLES_NAME,
            tracker,
            context.clock,
            mark=lambda: self.unseen_processes.mark_to_write,
        )

    def _cgroup_of(self, pid: int) -> int | None:
        root = self.context.cgroup_root()
        return cgroup_of_process(pid, root) if root is not None else None

    def unenforceable(self, pod: PodSpec) -> str | None:
        if pod_id_kind(pod.id) is PodIdKind.CGROUP:
            return None
        return (
            "the rm enforcer finds a pod's processes by their cgroup: name the pod by its cgroup "
            "path (/kubepods.slice/...); Kubernetes pods are found under `qpolicy daemon "
            "--kubernetes`"
        )

    # -- following the desired state -------------------------------------------------------------

    def sync(self, state: DesiredState) -> None:
        """Start, update or stop each GPU's control loop to match ``state``."""
        self._state = state
        wanted = {
            index: (state.gpu(index), list(state.pods_on(index)))
            for index in state.gpu_indices()
            if state.pods_on(index)
        }
        for index in [i for i in self._gpus if i not in wanted]:
            gone = self._gpus.pop(index)
            gone.periodic.cancel()
            gone.enforcer.release()
        for index, (gpu, pods) in wanted.items():
            driven = self._gpus.get(index)
            if driven is None:
                driven = self._start(index, pods)
                self._gpus[index] = driven
                driven.periodic.step()
                continue
            control = driven.periodic.control
            period_changed = control.gpu.period_ms != gpu.period_ms
            pods_changed = control.pods != pods
            control.gpu = gpu
            # Pods that left are opened and their timeslices restored at the next step, at the
            # latest one configured period from now (the slice scheduler lets go of them), and
            # pods that came are planned then: a stretched period is cut short for them.
            control.pods = pods
            if period_changed:
                driven.periodic.step()
            elif pods_changed:
                driven.periodic.wake()

    def _start(self, index: int, pods: list[PodSpec]) -> _Gpu:
        resolver = ProbeResolver(self.probe, lambda: self._state.pods, index, self.shared.locator)
        # Which timeslices keep online work ahead on this GPU is what its doctor measured.
        strategy = strategy_for(self.context.state_dir, index)
        log.info(
            "GPU %d: offline timeslice %d us, online %d us%s, from %s",
            index,
            strategy.offline_timeslice_us,
            strategy.online_timeslice_us,
            ", offline contexts CTA-preempted" if strategy.offline_preemption is not None else "",
            strategy.source,
        )
        enforcer = RmEnforcer(self.shared, resolver, strategy=strategy)
        control = ControlLoop(
            self._state.gpu(index),
            pods,
            enforcer,
            min_turn_us=self.min_turn_us,
            quiet=enforcer.scheduler.nothing_to_gate,
        )
        driven = _Gpu(PeriodicControl(self.context.loop, control), enforcer)
        enforcer.scheduler.on_wake = driven.periodic.wake
        return driven

    def refresh(self) -> None:
        self.handles.maybe_write()
        generation = self.probe.view.tracker.generation
        if generation != self._followed:
            # A process, TSG or channel came, or a tenant set a timeslice or preemption mode of
            # its own (libcuda does, ~110 ms after making a TSG): on a GPU in a quiet period the
            # levers follow within a tick, not at the next period's start a second away. Other
            # GPUs follow at their periods' starts, as before: following at every change there
            # cost ten pods 0.1-0.25 % of a core with a GPU host's own nvidia-smi calls (six
            # changes a second, make bench daemon, BENCHMARKS.md 2026-12-07).
            self._followed = generation
            for driven in self._gpus.values():
                if driven.periodic.control.stretched_for == "quiet":
                    driven.enforcer.follow_processes()
        now = self.context.clock()
        if now - self._reconciled_at >= RECONCILE_EVERY_S:
            self._reconciled_at = now
            self.shared.reconcile()
        if self.guard is not None and now - self._guard_checked_at >= CHECK_EVERY_S:
            self._guard_checked_at = now
            self.guard.check()
        self.unseen_processes.refresh(
            lambda: [p for p in self._state.pods if pod_id_kind(p) is PodIdKind.CGROUP]
        )
        if self.unseen_processes.searching:
            # The first slice as for one tick.
            since = now - self._advanced_at if self._advanced_at is not None else TICK_S
            self.unseen_processes.advance(min(SEARCH_SHARE * since, SEARCH_MOST_S))
            self._advanced_at = self.context.clock()
        else:
            self._advanced_at = None

    @property
    def unseen(self) -> dict[str, list[int]]:
        """Per pod: its processes using the GPU whose RM objects are not known (yet)."""
        return self.unseen_processes.unseen

    def publish(self) -> None:
        pass  # the sensors are read on every poll

    # -- reading ---------------------------------------------------------------------------------

    def enforcement(self, gpu: int, pod: str) -> Enforcement:
        driven = self._gpus.get(gpu)
        unseen = len(self.unseen.get(pod, ()))
        if driven is None:
            return Enforcement(unseen_processes=unseen)
        last = driven.periodic.control.last_plan
        planned = None
        if last is not None:
            planned = next((s.allocation for s in last.slices if s.pod == pod), None)
        sensor = driven.enforcer.sensor
        return Enforcement(
            gpu_time_s=sensor.gpu_time_us(pod) / 1e6,
            throttled_s=sensor.throttled_us.get(pod, 0.0) / 1e6,
            planned_share=planned,
            closed=pod in driven.enforcer.control.closed_pods(),
            unseen_processes=unseen,
        )

    def period_us(self, gpu: int) -> float | None:
        driven = self._gpus.get(gpu)
        last = driven.periodic.control.last_plan if driven is not None else None
        return None if last is None else float(last.period_us)

    def view(self) -> NodeView | None:
        return None

    @property
    def up(self) -> bool | None:
        return all(driven.periodic.failing is None for driven in self._gpus.values())

    def _cgroup_path(self, cgid: int) -> str | None:
        # Known paths only: a removed cgroup never seen by path stays among the busiest, and
        # asking for it would walk the hierarchy at every status write (58 ms with 300 pods).
        return self.probe.view.cgroups.known_path(cgid)

    def status(self) -> dict[str, Any]:
        return {
            # How often the handle file was rewritten, and why: what moves the tracker moves it.
            "handle_writes": self.handles.writes,
            "handle_writes_why": dict(self.handles.writes_why),
            # Looks that left the file as it was (processes that came and went unwritten, a
            # newer mark put off).
            "handle_unchanged": self.handles.unchanged,
            "tracker_changes": tracker_changes(self.probe.view.tracker, self._cgroup_path),
            "recovered": {
                "channel_groups_opened": self.recovery.opened,
                "timeslices_restored": self.recovery.restored,
                "preemption_modes_restored": self.recovery.modes,
                "problems": list(self.recovery.problems),
            },
            "adopted": {
                "processes": self.adoption.processes,
                "channels": self.adoption.channels,
                "objects": self.adoption.objects,
                "dropped": self.adoption.dropped,
                "problems": list(self.adoption.problems),
            },
            "gpus": {
                str(index): {
                    "closed": driven.enforcer.control.closed_pods(),
                    "periods": driven.periodic.steps,
                    "failing": driven.periodic.failing,
                    "control_errors": driven.enforcer.control.errors,
                    "online_strategy": driven.enforcer.strategy.describe(),
                    # Pods of several CUDA contexts here keep their TSGs' own timeslices.
                    "own_timeslices": driven.enforcer.control.several_contexts(),
                    # Pods whose contexts were given the strategy's compute preemption mode.
                    "preemption_modes": driven.enforcer.control.preemption.wanted(),
                    # Pods idle to the probe but open, checked on the GPU for work running.
                    "idle_checks": driven.enforcer.sensor.checks(),
                    # Turns handed back at once to a pod found running just after its turn
                    # ended idle (SliceScheduler._interrupts).
                    "turns_handed_back": driven.enforcer.scheduler.stats.interrupts,
                    # How the turns of closed periods ended, and how many periods were
                    # stretched to the minimum turn (the rest ran at the configured period).
                    "turn_ends": dict(sorted(driven.enforcer.scheduler.stats.ends.items())),
                    "periods_stretched": driven.periodic.control.stretched,
                    # The period in force (the plan's, stretched where it repeats): pods take
                    # turns in an order that rotates with the pod holding the GPU at a period's
                    # end, so their turns repeat every (offline pods) such periods.
                    "period_us": self.period_us(index),
                    "configured_period_us": self._state.gpu(index).period_ms * 1000,
                    # Why it is longer: "turns" (the minimum turn), "quiet" (nothing to gate).
                    "stretched_for": driven.periodic.control.stretched_for,
                }
                for index, driven in sorted(self._gpus.items())
            },
            "borrowed_files": len(self.shared.files),
            "unseen_processes": dict(sorted(self.unseen.items())),
            # Processes found by asking RM for their handles (qpolicy.nvrm.discover).
            "searched": self.unseen_processes.status(),
            # The process that undoes this daemon's changes if it is killed (guard.py).
            "guard": self.guard.status() if self.guard is not None else None,
        }

    def close(self) -> None:
        self.unseen_processes.close()
        for driven in self._gpus.values():
            driven.periodic.cancel()
            driven.enforcer.release()
        self._gpus.clear()
        self.shared.close()
        self.handles.write()  # the next daemon adopts what runs now
        if self.guard is not None and not self.shared.record.path.exists():
            # Everything is undone: nothing left to guard. Otherwise (a control still queued,
            # a reopen refused) the guard undoes the rest once this process has exited.
            self.guard.stop()
