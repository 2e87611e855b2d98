"""How an enforcer keeps online work ahead of offline work on one GPU: the *online strategy*.

The engine plans each class's TSG timeslice (qpolicy/engine.py: offline short, online long). Which
values act on a given GPU and driver is not known in advance: on 2026-11-23 the same setting halved
the online p50 on an H100 and did nothing on an H200 (docs/gpu-measurements.md §5). ``qpolicy
doctor`` measures the levers on the node's own GPU and caches its result next to the desired
state; the enforcers take their strategy from that cache, not from a constant:

* a recommended *setting* that is a pair of timeslices (``timeslice``, ``timeslice+rebuild``,
  ``timeslice-new``, ``cilp+timeslice``: 128 / 8192 µs; ``timeslice-1us``: GPreempt's 1 µs /
  1 s; ``timeslice-1us-8ms``: 1 / 8192 µs, the engine's own pair) replaces the plan's class
  timeslices;
* ``cta+timeslice-1us-8ms`` is the engine's pair, and offline pods' contexts set to CTA compute
  preemption (the rm enforcer: :mod:`~qpolicy.enforcers.rm.preemption`; qgpu.ko through its kernel
  RM client, kmod/qgpu/timeslice.c). A CTA save writes no
  registers but waits for the running thread blocks: next to a trainer of short kernels (24 µs)
  it gave the online stream a lower p50 than native and than CILP in each of four doctor runs
  (H100 and H200, docs/levers.md; by 0.00-0.02 ms in ``make bench-gpu``), and next to long ones
  (1.4 ms) it doubled it (H100 and H200). It is for a GPU whose offline work runs short kernels,
  where the doctor, run with such a trainer (``--trainer-n 2048``), finds it more than its noise
  margin better than the engine's pair *and*, checked in the same run next to its long-kernel
  trainer, no worse than the pair there: it is set on every offline pod, whatever kernels they
  run. A recommendation without that check (``long_kernels_checked``) gets its timeslices only;
* another setting (``interleaved``) leaves the engine's timeslices, and says so;
* a recommended *per-request* lever, or none, leaves the engine's timeslices: a control at every
  request costs a GSP round trip each (hundreds of µs, measured by the doctor), which no daemon can
  afford per request; the doctor's table says what the GPU then does, and the README what qpolicy
  promises there.

The cache is a file the doctor writes; this module only reads it (the doctor is a layer above).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpolicy.engine import OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US, Plan
from qpolicy.model import PodClass
from qpolicy.nvrm.abi import PREEMPTION_MODE_COMPUTE as PREEMPTION_MODES
from qpolicy.nvrm.abi import PREEMPTION_MODE_CTA as CTA

log = logging.getLogger(__name__)

#: The doctor's cached result per GPU, in the state directory (written by qpolicy.doctor.report).
DOCTOR_CACHE_NAME = "doctor-gpu{gpu}.json"
DOCTOR_SCHEMA = 1

# GPreempt's pair: a 1 µs best-effort slice, 1 s for the latency-critical context.
GPREEMPT_OFFLINE_US, GPREEMPT_ONLINE_US = 1, 1_000_000
# The engine's offline timeslice until 2026-11-26, which the doctor's first levers set.
EARLIER_OFFLINE_US = 128

# The lever that adds CTA for offline contexts to the engine's pair.
CTA_LEVER = "cta+timeslice-1us-8ms"

# The doctor's setting levers that are a pair of timeslices (offline µs, online µs); the doctor's
# levers (qpolicy/doctor/levers.py) set these same constants.
TIMESLICE_LEVERS = {
    "timeslice": (EARLIER_OFFLINE_US, ONLINE_TIMESLICE_US),
    "timeslice+rebuild": (EARLIER_OFFLINE_US, ONLINE_TIMESLICE_US),
    "timeslice-new": (EARLIER_OFFLINE_US, ONLINE_TIMESLICE_US),
    "cilp+timeslice": (EARLIER_OFFLINE_US, ONLINE_TIMESLICE_US),
    "timeslice-1us": (GPREEMPT_OFFLINE_US, GPREEMPT_ONLINE_US),
    "timeslice-1us-8ms": (GPREEMPT_OFFLINE_US, ONLINE_TIMESLICE_US),
    CTA_LEVER: (GPREEMPT_OFFLINE_US, ONLINE_TIMESLICE_US),
}
# The setting levers that also set offline contexts' compute preemption mode.
PREEMPTION_LEVERS = {CTA_LEVER: CTA}


@dataclass(frozen=True, slots=True)
class OnlineStrategy:
    offline_timeslice_us: int = OFFLINE_TIMESLICE_US
    online_timeslice_us: int = ONLINE_TIMESLICE_US
    #: Where the choice came from, for the log and ``qpolicy status``.
    source: str = "the engine's default (no doctor result for this GPU)"
    #: The compute preemption mode offline pods' contexts are given (CTA), or None to leave the
    #: one they have (CILP, as libcuda sets it).
    offline_preemption: int | None = None
    #: What the doctor's result says qpolicy can promise online work on the GPU, one line per
    #: online target (qpolicy.doctor.promise), for ``qpolicy status``; () without one.
    promise: tuple[str, ...] = ()

    @property
    def is_default(self) -> bool:
        return (
            self.offline_timeslice_us,
            self.online_timeslice_us,
            self.offline_preemption,
        ) == (OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US, None)

    def adjust(self, plan: Plan) -> Plan:
        """``plan`` with this strategy's timeslices where the engine set its class timeslices."""
        if (self.offline_timeslice_us, self.online_timeslice_us) == (
            OFFLINE_TIMESLICE_US,
            ONLINE_TIMESLICE_US,
        ):
            return plan
        values = {
            PodClass.ONLINE: self.online_timeslice_us,
            PodClass.OFFLINE: self.offline_timeslice_us,
        }
        slices = tuple(
            s if s.timeslice_us is None else s._replace(timeslice_us=values[s.pod_class])
            for s in plan.slices
        )
        return dataclasses.replace(plan, slices=slices)

    def describe(self) -> dict[str, Any]:
        return {
            "offline_timeslice_us": self.offline_timeslice_us,
            "online_timeslice_us": self.online_timeslice_us,
            "offline_preemption": (
                None
                if self.offline_preemption is None
                else PREEMPTION_MODES[self.offline_preemption]
            ),
            "source": self.source,
            "promise": list(self.promise),
        }


DEFAULT = OnlineStrategy()


def from_doctor(report: Any) -> OnlineStrategy:
    """The strategy a doctor result recommends; the default where it recommends nothing usable.
    It carries the result's promise (``promise_lines``).

    Never raises: the cache is read at run time, and a damaged one must not stop the daemon.
    """
    if not isinstance(report, dict):
        return DEFAULT
    return dataclasses.replace(_recommended(report), promise=promise_lines(report))


_VERDICTS = {True: "met", False: "MISSED", None: "not judged"}


def promise_lines(report: dict[str, Any]) -> tuple[str, ...]:
    """The doctor's promise in ``report`` as one line per online target ("online p99 <= 1.5 x
    solo's: 1.00 ms, 1.17 x solo's 0.86: met"); () where there is none or it is damaged (the
    doctor writes it: qpolicy.doctor.promise)."""
    promise = report.get("promise")
    targets = promise.get("targets") if isinstance(promise, dict) else None
    if not isinstance(targets, list):
        return ()
    lines = []
    for target in targets:
        if not isinstance(target, dict):
            continue
        text, measured, met = target.get("text"), target.get("measured"), target.get("met")
        if not isinstance(text, str) or not isinstance(measured, str) or met not in _VERDICTS:
            continue
        verdict = "" if measured.startswith("not ") else f": {_VERDICTS[met]}"
        lines.append(f"{text}: {measured}{verdict}")
    return tuple(lines)


def _recommended(report: dict[str, Any]) -> OnlineStrategy:
    recommendation = report.get("recommendation")
    lever = recommendation.get("lever") if isinstance(recommendation, dict) else None
    date = report.get("date", "an unknown date")
    if lever in TIMESLICE_LEVERS:
        offline, online = TIMESLICE_LEVERS[lever]
        source = f"qpolicy doctor of {date}: {lever}"
        mode = PREEMPTION_LEVERS.get(lever)
        checked = isinstance(recommendation, dict) and recommendation.get("long_kernels_checked")
        if mode is not None and checked is not True:
            # A doctor of before 2026-12-03 recommended CTA from a short-kernel run alone (an
            # H100 did, call 13A); next to long kernels CTA doubles the online p50.
            mode = None
            source += (
                ", its timeslices only: the run did not check CTA next to long kernels "
                "(run qpolicy doctor again)"
            )
        return OnlineStrategy(offline, online, source, mode)
    if lever is None:
        why = recommendation.get("why") if isinstance(recommendation, dict) else None
        return OnlineStrategy(
            source=f"the engine's default: qpolicy doctor of {date} found no lever that helps "
            f"({why or 'no reason given'})"
        )
    if isinstance(recommendation, dict) and recommendation.get("kind") == "setting":
        what = "a setting the enforcers do not make"
    else:
        what = "a control per request, which the daemon does not send"
    return OnlineStrategy(
        source=f"the engine's default: qpolicy doctor of {date} recommends {lever}, {what}"
    )


def doctor_cache_path(state_dir: Path, gpu: int) -> Path:
    return state_dir / DOCTOR_CACHE_NAME.format(gpu=gpu)


def read_doctor_cache(state_dir: Path, gpu: int) -> dict[str, Any] | None:
    """The last doctor result for ``gpu``, or None (absent, unreadable or of another schema)."""
    try:
        report = json.loads(doctor_cache_path(state_dir, gpu).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("schema") != DOCTOR_SCHEMA:
        return None
    return report


def strategy_for(state_dir: Path, gpu: int) -> OnlineStrategy:
    """The online strategy for ``gpu`` from the doctor's cache in ``state_dir``."""
    return from_doctor(read_doctor_cache(state_dir, gpu))
