"""One doctor run: the online stream alone, then next to the trainer with each lever in turn, and
last both as clients of one MPS server (a comparison: MPS is not a lever qpolicy sets).

Each phase lasts ``phase_s``; its first ``settle_s`` is left out (the lever takes effect, the
queues drain). Whatever a lever set is undone at the end of its phase, and everything is undone
(and both workloads stopped) if the run fails or is interrupted. The trainer's context switches
are counted per phase (GR_GET_CTXSW_STATS on its compute TSG): they show whether a lever changed
how the GPU switches, not only the latency. Where the GPU logs them, the switches themselves are
read too (the FECS trace, qpolicy.nvrm.fecs): per phase, how many times an online context began
right after the trainer's save, how long after (the restore), and how long each ran.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from qpolicy import __version__
from qpolicy.doctor.lab import Call, Lab
from qpolicy.doctor.levers import LEVERS, Lever, Objects
from qpolicy.doctor.mps import mps_server
from qpolicy.doctor.promise import promise
from qpolicy.doctor.report import (
    CHECK,
    DEFAULT_LEVERS,
    LONG_TRAINER_N,
    SCHEMA,
    calls_summary,
    latency_stats,
    recommend,
)
from qpolicy.enforcers.strategy import PREEMPTION_LEVERS
from qpolicy.errors import QPolicyError
from qpolicy.nvrm import abi
from qpolicy.nvrm.fecs import FecsTrace, Record, request_waits, switches

SOLO = Lever("solo", "baseline", "the online stream alone")
SOLO_AFTER = Lever("solo-after", "baseline", "the online stream alone again, after the levers")


@dataclass(frozen=True, slots=True)
class DoctorConfig:
    gpu: int
    trainer_n: int = LONG_TRAINER_N
    online_n: int = 4096
    hz: float = 150.0
    phase_s: float = 4.0
    settle_s: float = 0.5
    levers: tuple[str, ...] = tuple(lever.name for lever in LEVERS)
    mps: bool = True  # the MPS comparison phase
    fecs: bool = True  # the FECS trace, where the GPU logs it


class Trace(Protocol):
    """What the doctor reads the FECS trace with (qpolicy.nvrm.fecs.FecsTrace)."""

    steps: list[dict[str, Any]]
    #: Records RM could not add since the trace opened (its buffer full).
    dropped: int

    def open(self) -> Any: ...

    def read(self) -> list[Record]: ...

    def gpu_minus_cpu_ns(self) -> int: ...

    def close(self) -> None: ...


MPS = Lever(
    "mps",
    "comparison",
    "both workloads as clients of one MPS server of the doctor's own (no cap, no priority): "
    "one context, no time-slicing; not a lever qpolicy sets",
)


def discover(lab: Lab) -> Objects:
    assert lab.trainer is not None and lab.online is not None
    trainer = lab.groups(lab.trainer)
    online = lab.groups(lab.online)
    tracker = lab.handles.tracker
    return Objects(
        trainer=trainer,
        online=online,
        trainer_compute=tracker.compute_channels(lab.trainer.pid),
        online_compute=tracker.compute_channels(lab.online.pid),
    )


def read_originals(lab: Lab, objects: Objects) -> tuple[list[Call], dict[str, str]]:
    """What the doctor may change, as it is now: timeslices, compute preemption modes and
    interleave levels. Returns the calls and each compute channel's preemption mode."""
    calls: list[Call] = []
    modes: dict[str, str] = {}
    for group in (*objects.trainer, *objects.online):
        for tsg in group.tsgs:
            call = lab.control(
                group, f"TSG {tsg:#x}", tsg, abi.NVA06C_CTRL_CMD_GET_TIMESLICE, timesliceUs=0
            )
            calls.append(call)
            if call.status == 0:
                objects.timeslices[(group.client, tsg)] = call.answer["timesliceUs"]
    for which, channels in (
        ("trainer", objects.trainer_compute),
        ("online", objects.online_compute),
    ):
        for client, channel, _ in channels:
            group = objects.group_of(client)
            assert group.subdevice is not None
            call = lab.control(
                group,
                f"{which} channel {channel:#x}",
                group.subdevice,
                abi.NV2080_CTRL_CMD_GR_GET_CTXSW_MODES,
                hChannel=channel,
            )
            calls.append(call)
            if call.status == 0:
                mode = call.answer["cilpPreemptMode"]
                objects.cilp[(client, channel)] = mode
                modes[f"{which} {channel:#x}"] = abi.PREEMPTION_MODE_COMPUTE.get(mode, str(mode))
            level = lab.control(
                group, f"{which} channel {channel:#x}", channel,
                abi.NVA06F_CTRL_CMD_GET_INTERLEAVE_LEVEL, channelInterleaveLevel=0,
            )  # fmt: skip
            calls.append(level)
            if level.status == 0:
                objects.interleave[(client, channel)] = level.answer["channelInterleaveLevel"]
    return calls, modes


def trainer_saves(lab: Lab, objects: Objects) -> dict[str, int] | None:
    """The trainer compute TSG's context-save counters, summed over its compute TSGs."""
    total: dict[str, int] = {}
    for client, tsg in objects.compute_tsgs("trainer"):
        saves = lab.saves(objects.group_of(client), tsg, f"trainer TSG {tsg:#x}")
        if saves is None:
            return None
        for name, count in saves.items():
            total[name] = total.get(name, 0) + count
    return total


def _rate(samples: list[tuple[float, float]]) -> float | None:
    """Matmuls per second from (time, cumulative matmuls) samples of one window."""
    if len(samples) < 2:
        return None
    (t0, d0), (t1, d1) = samples[0], samples[-1]
    return (d1 - d0) / (t1 - t0) if t1 > t0 else None


class Doctor:
    def __init__(
        self,
        lab: Lab,
        config: DoctorConfig,
        trace: Callable[[int, str | None], Trace] | None = None,
    ) -> None:
        self.lab = lab
        self.config = config
        self._per_request: list[Call] = []
        self._lock = threading.Lock()
        self._new_trace = trace
        self._trace: Trace | None = None

    def run(self, gpu_info: dict[str, Any]) -> dict[str, Any]:
        lab, config = self.lab, self.config
        phases: list[dict[str, Any]] = []
        measured = round((config.phase_s - config.settle_s) * config.hz)
        notes = [
            f"each phase {config.phase_s:g} s at {config.hz:g} requests/s, the first "
            f"{config.settle_s:g} s left out: about {measured} requests a phase"
            + (
                ", so a p99 is indicative (a p99 needs 1 000 or more; `make bench-gpu` "
                "measures 3 000 and more)"
                if measured < 1000
                else ""
            ),
            "online latency runs from each request's slot to its result, including the doctor's "
            "go-ahead (the same in every phase)",
        ]
        report: dict[str, Any] = {
            "schema": SCHEMA,
            "qpolicy": __version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "gpu": gpu_info,
            "workloads": {
                "trainer": f"bf16 matmul n={config.trainer_n}",
                "online": f"bf16 matmul n={config.online_n} at {config.hz:g}/s",
            },
            "phases": phases,
            "notes": notes,
        }
        try:
            if config.fecs:
                report["fecs"] = self._open_trace(gpu_info.get("bus"))
                notes.append(
                    "the FECS context-switch trace was read: restore = an online context's "
                    "start after the trainer's save ended"
                    if self._trace is not None
                    else f"the FECS context-switch trace was not read ({report['fecs']['error']})"
                )
            lab.start_online(config.online_n, config.hz)
            phases.append(self._phase(SOLO, None))
            lab.start_trainer(config.trainer_n)
            objects = discover(lab)
            originals, modes = read_originals(lab, objects)
            report["preemption_modes"] = modes
            report["originals"] = [call.to_json() for call in originals]
            for lever in LEVERS:
                # The baselines are what every lever is judged against: --levers only picks
                # among the others (a run without native could recommend nothing, and its
                # cache would replace a good one with that).
                if lever.name not in config.levers and lever.kind != "baseline":
                    continue
                if lever.new_trainer:
                    objects = self._new_trainer(objects)
                phases.append(self._phase(lever, objects))
            checked = [name for name in PREEMPTION_LEVERS if name in config.levers]
            if checked and config.trainer_n < LONG_TRAINER_N:
                notes.append(
                    f"{', '.join(checked)} and the engine's pair measured again next to a "
                    f"{LONG_TRAINER_N} trainer (kind check): the daemon would set "
                    f"{'them' if len(checked) > 1 else 'it'} on every offline pod, whatever "
                    "kernels they run"
                )
                phases += self._long_kernel_check(checked)
            # The online stream alone again, the trainer stopped: where the host unsettled the
            # first solo, the levers are held to this one (report.solo_phase()).
            if lab.trainer is not None:
                lab.trainer.stop()
                lab.trainer = None
            phases.append(self._phase(SOLO_AFTER, None))
            if config.mps:
                phases.append(self._mps_phase())
        finally:
            lab.before_request = lab.after_request = None
            lab.stop()
            if self._trace is not None:
                self._trace.close()
                self._trace = None
        report["recommendation"] = recommend(phases, config.trainer_n)
        report["promise"] = promise(phases, report["recommendation"])
        return report

    def _open_trace(self, bus: str | None) -> dict[str, Any]:
        """Open the FECS trace; what it took, or which step RM refused (the run goes on)."""
        trace = (self._new_trace or FecsTrace)(self.config.gpu, bus)
        try:
            trace.open()
        except (QPolicyError, OSError) as error:  # FecsError, or RmError where an ioctl failed
            trace.close()
            return {"error": str(error), "steps": trace.steps}
        self._trace = trace
        return {"steps": trace.steps}

    def _switches(
        self, records: list[Record] | None, window: tuple[float, float]
    ) -> dict[str, Any] | None:
        """The phase's switches between the online stream and the trainer (fecs.switches),
        and where they fell in the window's requests (fecs.request_waits)."""
        lab = self.lab
        if records is None or lab.online is None or self._trace is None:
            return None
        online = {lab.online.pid}
        offline = {lab.trainer.pid} if lab.trainer is not None else set()
        found = switches(records, online, offline)
        found["dropped_so_far"] = self._trace.dropped  # above 0: the counts miss switches
        try:
            offset = self._trace.gpu_minus_cpu_ns()
        except (QPolicyError, OSError) as error:  # FecsError, or RmError where an ioctl failed
            found["requests"] = {"error": str(error)}
            return found
        requests = lab.online.launched_between(*window)
        found["requests"] = request_waits(records, offset, requests, online, offline)
        return found

    def _read_trace(self) -> list[Record] | None:
        if self._trace is None:
            return None
        try:
            return self._trace.read()
        except (QPolicyError, OSError):  # FecsError, or RmError where an ioctl failed
            return None

    def _long_kernel_check(self, names: list[str]) -> list[dict[str, Any]]:
        """The compute preemption levers ``names``, and the engine's pair beside them, measured
        again next to a trainer of LONG_TRAINER_N, which replaces the run's short-kernel one.
        The daemon sets such a lever on every offline pod of the GPU, whatever kernels they
        run, and CTA doubled the online p50 next to long kernels where it helped next to short
        ones (report.py): the recommendation takes it only where this check passes."""
        lab = self.lab
        levers = [lever for lever in LEVERS if lever.name in DEFAULT_LEVERS or lever.name in names]
        assert lab.trainer is not None
        lab.trainer.stop()
        try:
            lab.start_trainer(LONG_TRAINER_N)
            objects = discover(lab)
            read_originals(lab, objects)
        except (QPolicyError, OSError, subprocess.SubprocessError) as error:
            # The run's phases stand; the lever is held back, its check named as failed.
            failed = f"the {LONG_TRAINER_N} trainer: {type(error).__name__}: {error}"
            return [
                {
                    "lever": lever.name,
                    "kind": CHECK,
                    "trainer_n": LONG_TRAINER_N,
                    "description": lever.description,
                    "calls": {},
                    "online": latency_stats([]),
                    "trainer_it_per_s": None,
                    "error": failed,
                }
                for lever in levers
            ]
        phases = []
        for lever in levers:
            phase = self._phase(lever, objects)
            phase.update(kind=CHECK, trainer_n=LONG_TRAINER_N)
            phases.append(phase)
        return phases

    def _mps_phase(self) -> dict[str, Any]:
        """Both workloads started again as clients of a private MPS server, measured like a
        lever (nothing is set on them). A server that cannot start is the phase's error."""
        lab, config = self.lab, self.config
        lab.stop()
        base_env = lab.env
        phase: dict[str, Any] | None = None
        try:
            with mps_server() as dirs:
                lab.env = {**base_env, **dirs}
                try:
                    lab.start_online(config.online_n, config.hz)
                    lab.start_trainer(config.trainer_n)
                    phase = self._phase(MPS, None)
                finally:
                    lab.stop()
        except (QPolicyError, OSError, subprocess.SubprocessError) as error:
            failed = f"{type(error).__name__}: {error}"
            if phase is None:
                phase = {
                    "lever": MPS.name,
                    "kind": MPS.kind,
                    "description": MPS.description,
                    "calls": {},
                    "online": latency_stats([]),
                    "trainer_it_per_s": None,
                }
            phase["error"] = phase.get("error") or failed
        finally:
            lab.env = base_env
        assert phase is not None
        return phase

    def _new_trainer(self, objects: Objects) -> Objects:
        assert self.lab.trainer is not None
        self.lab.trainer.stop()
        self.lab.start_trainer(self.config.trainer_n, wait=True)
        fresh = discover(self.lab)
        read_originals(self.lab, fresh)
        return fresh

    def _hook(self, objects: Objects, step: Any) -> Any:
        if step is None:
            return None

        def run() -> None:
            calls = step(self.lab, objects)
            with self._lock:
                self._per_request.extend(calls)

        return run

    def _phase(self, lever: Lever, objects: Objects | None) -> dict[str, Any]:
        lab, config = self.lab, self.config
        calls: list[Call] = []
        error = None
        saves_before = trainer_saves(lab, objects) if objects is not None else None
        self._read_trace()  # what came before this phase
        self._per_request = []
        start = time.time()
        try:
            if objects is not None:
                calls += lever.apply(lab, objects)
                lab.before_request = self._hook(objects, lever.before)
                lab.after_request = self._hook(objects, lever.after)
            if lever.new_trainer and lab.trainer is not None:
                lab.trainer.send("go")
            start = time.time()
            time.sleep(config.phase_s)
        except Exception as error_:  # one lever failing must not end the run
            error = f"{type(error_).__name__}: {error_}"
        finally:
            end = time.time()
            lab.before_request = lab.after_request = None
            time.sleep(0.05)  # a request released under the lever finishes
            if objects is not None:
                try:
                    calls += lever.undo(lab, objects)
                except Exception as error_:
                    error = error or f"undo: {type(error_).__name__}: {error_}"
        saves_after = trainer_saves(lab, objects) if objects is not None else None
        window = (start + config.settle_s, end)
        fecs = self._switches(self._read_trace(), window)
        assert lab.online is not None
        latencies = [ms for _, ms in lab.online.between(*window)]
        trainer = lab.trainer.between(*window) if lab.trainer is not None else []
        with self._lock:
            per_request = list(self._per_request)
        phase: dict[str, Any] = {
            "lever": lever.name,
            "kind": lever.kind,
            "description": lever.description,
            "calls": calls_summary([c.to_json() for c in (*calls, *per_request)]),
            "online": latency_stats(latencies),
            "trainer_it_per_s": None if lab.trainer is None else _rate(trainer),
        }
        if saves_before is not None and saves_after is not None:
            phase["trainer_saves"] = {k: saves_after[k] - saves_before[k] for k in saves_after}
        if fecs is not None:
            phase["fecs"] = fecs
        if error is not None:
            phase["error"] = error
        return phase
