"""What qpolicy can promise online work on this GPU, from a doctor run.

The daemon runs the lever the doctor recommends where its enforcers carry it out, or the
engine's own pair (qpolicy/enforcers/strategy.py, ``from_doctor``). The phase of the lever that
sets what it runs is held against the online targets (issue 14), as `make bench-gpu` holds its
online rows:

* online p99 within 1.5 x solo's, and p50 within 1.2 x solo's, where solo is stable (a solo p99
  over UNSTABLE_SOLO x its p50 is not divided by);
* the trainer at TRAINER_FLOOR or more of its throughput next to the online stream under native
  time-slicing;
* better than native time-slicing, and than MPS where the doctor ran it, at both p50 and p99.

A target is met, missed, or not judged (with why). Where one against solo is missed, the
evidence says whether any lever of the run met it, and, where the GPU's own log of its context
switches was read (qpolicy.nvrm.fecs), what the switch each request waited for took: the time
from the launch to the trainer's save end, and the online context's restore after it. An
operator reads there what qpolicy can promise on the node, and why it cannot promise more.

The doctor's phases are seconds long: a p99 of fewer than 1 000 requests is indicative, which
the result says; `make bench-gpu` measures 3 000 and more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

from qpolicy.doctor.report import DEFAULT_LEVERS, LEVER_KINDS, refused, solo_phase
from qpolicy.doctor.targets import (
    P50_BOUND,
    P99_BOUND,
    TRAINER_FLOOR,
    UNSTABLE_SOLO,
    against_solo,
    better_than,
    trainer_kept,
)
from qpolicy.enforcers.strategy import (
    PREEMPTION_LEVERS,
    TIMESLICE_LEVERS,
    from_doctor,
    promise_lines,
)

# Fewer requests than this make a p99 of a handful of samples: the result says it is indicative.
P99_REQUESTS = 1000


def daemon_lever(
    levers: dict[str, dict[str, Any]], recommendation: dict[str, Any]
) -> tuple[str | None, str]:
    """The measured lever that sets what the daemon will run after this result
    (strategy.from_doctor: the recommended lever where the enforcers carry it out, its
    timeslices alone where its CTA was not checked next to long kernels, the engine's pair
    otherwise), and how it came to be that one."""
    strategy = from_doctor({"recommendation": recommendation})
    recommended = recommendation.get("lever")
    pair = (strategy.offline_timeslice_us, strategy.online_timeslice_us)

    def sets(name: str) -> bool:
        return (
            TIMESLICE_LEVERS.get(name) == pair
            and PREEMPTION_LEVERS.get(name) == strategy.offline_preemption
        )

    if recommended is not None and sets(recommended):
        return recommended, "the recommended lever"
    # Several levers set the same timeslices; the engine's own first.
    name = min(
        (n for n in levers if sets(n)), key=lambda n: (n not in DEFAULT_LEVERS, n), default=None
    )
    if recommended is None:
        how = "the engine's pair, which the daemon runs where the doctor recommends no lever"
    elif recommended in TIMESLICE_LEVERS:
        how = (
            f"the timeslices of the recommended {recommended} alone, which the daemon runs: its "
            "preemption mode was not checked next to long kernels"
        )
    else:
        how = f"the engine's pair, which the daemon runs: it does not carry out {recommended}"
    return name, how


def _usable(phase: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """Whether ``phase`` is there, did not fail and measured both percentiles."""
    return (
        phase is not None
        and not phase.get("error")
        and phase["online"].get("p50_ms") is not None
        and phase["online"].get("p99_ms") is not None
    )


def _target(name: str, text: str, measured: str, met: bool | None) -> dict[str, Any]:
    return {"target": name, "text": text, "measured": measured, "met": met}


def promise(phases: Sequence[dict[str, Any]], recommendation: dict[str, Any]) -> dict[str, Any]:
    """The online targets held against the lever the daemon will run after this doctor run
    (``recommendation`` is report.recommend's), each met (True), missed (False) or not judged
    (None), with the evidence for a target against solo that was missed."""
    levers = {p["lever"]: p for p in phases if p["kind"] in LEVER_KINDS}
    name, how = daemon_lever(levers, recommendation)
    phase = levers.get(name) if name is not None else None
    if not _usable(phase):
        return {
            "lever": name,
            "met": None,
            "targets": [],
            "evidence": [],
            "why": f"no lever of this run sets what the daemon runs ({how})"
            if name is None
            else f"{name}, {how}, measured no requests in this run",
        }
    by_name = {p["lever"]: p for p in phases}
    online = phase["online"]
    p50, p99 = float(online["p50_ms"]), float(online["p99_ms"])
    solo = solo_phase(phases)
    targets: list[dict[str, Any]] = []
    evidence: list[str] = []

    # Against solo.
    if _usable(solo):
        s50, s99 = float(solo["online"]["p50_ms"]), float(solo["online"]["p99_ms"])
        judged = against_solo(p50, p99, s50, s99)
        after = " (the solo after the levers)" if solo["lever"] == "solo-after" else ""
        if judged is None:
            why = f"not judged: solo unstable (p99 {s99:.2f} > {UNSTABLE_SOLO:g} x p50 {s50:.2f})"
            targets.append(_target("p99", f"online p99 <= {P99_BOUND:g} x solo's", why, None))
            targets.append(_target("p50", f"online p50 <= {P50_BOUND:g} x solo's", why, None))
        else:
            for key, value, base, bound, ratio, met in (
                ("p99", p99, s99, P99_BOUND, judged.p99_ratio, judged.p99_met),
                ("p50", p50, s50, P50_BOUND, judged.p50_ratio, judged.p50_met),
            ):
                targets.append(
                    _target(
                        key,
                        f"online {key} <= {bound:g} x solo's",
                        f"{value:.2f} ms, {ratio:.2f} x solo's {base:.2f}{after}",
                        met,
                    )
                )
                if not met:
                    evidence += _why_missed(key, bound, base, name or "", phases, phase, solo)
    else:
        for key, bound in (("p99", P99_BOUND), ("p50", P50_BOUND)):
            targets.append(
                _target(key, f"online {key} <= {bound:g} x solo's", "not judged: no solo", None)
            )

    # The trainer, against its throughput next to the online stream under native time-slicing.
    native = by_name.get("native")
    trainer = phase.get("trainer_it_per_s")
    base_trainer = (native or {}).get("trainer_it_per_s")
    text = f"trainer >= {TRAINER_FLOOR:.0%} of its throughput beside native time-slicing"
    if trainer and base_trainer:
        keeps, kept = trainer_kept(trainer, base_trainer)
        targets.append(_target("trainer", text, f"{keeps:.0%}", kept))
    else:
        why = "a trainer reported nothing" if native is not None else "no native baseline"
        targets.append(_target("trainer", text, f"not judged: {why}", None))

    # Better than the alternatives at both percentiles.
    for key, what, other in (
        ("native", "native time-slicing", native),
        ("mps", "MPS", by_name.get("mps")),
    ):
        text = f"better than {what} at p50 and p99"
        if _usable(other):
            o50, o99 = float(other["online"]["p50_ms"]), float(other["online"]["p99_ms"])
            measured = f"{p50:.2f} / {p99:.2f} against {o50:.2f} / {o99:.2f} ms"
            targets.append(_target(key, text, measured, better_than(p50, p99, o50, o99)))
        else:
            why = "not measured" if other is None else "not judged: its phase failed"
            targets.append(_target(key, text, why, None))

    verdicts = [t["met"] for t in targets]
    overall = False if False in verdicts else (None if None in verdicts else True)
    requests = int(online.get("requests") or 0)
    return {
        "lever": name,
        "how": how,
        "requests": requests,
        "p99_indicative": requests < P99_REQUESTS,
        "met": overall,
        "targets": targets,
        "evidence": evidence,
    }


def _why_missed(
    key: str,
    bound: float,
    base: float,
    name: str,
    phases: Sequence[dict[str, Any]],
    phase: dict[str, Any],
    solo: dict[str, Any],
) -> list[str]:
    """Why the lever's ``key`` percentile missed ``bound`` x solo's ``base``: whether any other
    lever of the run met it, and what the GPU's log says the switch took."""
    ratios = sorted(
        (float(p["online"][f"{key}_ms"]) / base, p["lever"])
        for p in phases
        if p["kind"] in LEVER_KINDS and _usable(p) and not refused(p)
    )
    met_by = [f"{lever} ({ratio:.2f} x)" for ratio, lever in ratios if ratio <= bound]
    if met_by:
        lines = [
            f"the {key} target: met here by {', '.join(met_by)}, which the doctor did not "
            "recommend (the recommendation says why)"
        ]
    elif ratios:
        ratio, lever = ratios[0]
        lines = [
            f"the {key} target: no lever RM accepted met it here (the nearest: {lever}, "
            f"{ratio:.2f} x solo's {base:.2f} ms)"
        ]
    else:
        lines = [f"the {key} target: no other lever was measured"]
    # The switch is what the p50 waits for; the p99 has the trainer's tail besides, so for the
    # p99 the log can only say whether the switch alone leaves room for that tail.
    allowance = (bound - 1) * base
    switch = _switch(phase, solo, allowance) if key == "p50" else _p99_switch(phase, allowance)
    if switch:
        lines.append(f"the {key} target, on the GPU's log of its switches ({name}): {switch}")
    return lines


def _p99_switch(phase: dict[str, Any], allowance_ms: float) -> str | None:
    """The switch's p50 from the phase's FECS trace (from the launch call's return to the end of
    the trainer's save, and the online context's restore; the restore alone where the requests
    were not placed on the log) against the ``allowance_ms`` the p99 target leaves over solo's
    p99; None where the log was not read. On a host whose solo p99 is low, the median switch
    alone can take more than that (an H100, call 43D: 226 µs against 203)."""
    fecs = phase.get("fecs") or {}
    restore = fecs.get("restore_us")
    if not restore:
        return None
    switching = _switching_us(fecs)
    if switching is not None:
        took = f"about {switching:.0f} µs of switching (p50)"
    else:
        took = f"the online context's restore alone took {restore['p50']:.0f} µs (p50)"
    return (
        f"{took}, where the target leaves {allowance_ms * 1000:.0f} µs over solo's p99 for the "
        "switch and the trainer's tail together"
    )


def _switching_us(fecs: dict[str, Any]) -> float | None:
    """The switch's p50 in µs: from the launch call's return to the end of the trainer's save,
    and the online context's restore; None where the log lacks either. One definition for both
    targets' lines."""
    restore = fecs.get("restore_us")
    after_call = (fecs.get("requests") or {}).get("returned_to_save_end_us")
    if not restore or not after_call:
        return None
    return float(after_call["p50"]) + float(restore["p50"])


def _switch(phase: dict[str, Any], solo: dict[str, Any], allowance_ms: float) -> str | None:
    """What the switch each request waited for took, from the phase's FECS trace, against the
    ``allowance_ms`` the target leaves over solo's p50; None where the log was not read. Where
    the workload said when its launch call returned (its work and doorbell written), the switch
    is counted from there: the call costs solo as much."""
    fecs = phase.get("fecs") or {}
    requests = fecs.get("requests") or {}
    solo_requests = (solo.get("fecs") or {}).get("requests") or {}
    restore = fecs.get("restore_us")
    if not restore:
        return None
    allowance = f"where the target leaves {allowance_ms * 1000:.0f} µs over solo's p50"
    text = (
        f"the online context's restore after the trainer's save took {restore['p50']:.0f} µs "
        f"(p50), {allowance}"
    )
    placed, asked = requests.get("placed"), requests.get("requests")
    to_save_end = requests.get("to_save_end_us")
    after_call = requests.get("returned_to_save_end_us")
    call, solo_call = requests.get("launch_call_us"), solo_requests.get("launch_call_us")
    switching = _switching_us(fecs)
    if placed and after_call and switching is not None and call:
        alone = f"; alone {solo_call['p50']:.0f}" if solo_call else ""
        text = (
            f"{placed} of {asked} requests waited for a switch: the trainer's save ended "
            f"{after_call['p50']:.0f} µs after the launch call returned ({call['p50']:.0f} µs "
            f"after the launch{alone}), and the online context's restore took "
            f"{restore['p50']:.0f} µs more (p50): about "
            f"{switching:.0f} µs of switching, {allowance}"
        )
    elif placed and to_save_end:
        text = (
            f"{placed} of {asked} requests waited for a switch: the trainer's save ended "
            f"{to_save_end['p50']:.0f} µs after the launch, and the online context's restore "
            f"took {restore['p50']:.0f} µs more (p50), {allowance}"
        )
    done, solo_done = requests.get("launch_to_done_us"), solo_requests.get("launch_to_done_us")
    if done and solo_done:
        text += f"; launch to done {done['p50']:.0f} µs against solo's {solo_done['p50']:.0f}"
    return text


def lines(result: dict[str, Any] | None) -> list[str]:
    """The promise as the doctor prints it under its table."""
    if not result:
        return []
    if not result.get("targets"):
        return ["", f"what qpolicy can promise online work here: not known ({result['why']})"]
    indicative = (
        f"; a p99 of {result['requests']} requests is indicative"
        if result.get("p99_indicative")
        else ""
    )
    out = [
        "",
        f"what qpolicy can promise online work here, from this run ({result['lever']}, "
        f"{result['how']}; {result['requests']} requests a phase{indicative}):",
    ]
    out += [f"- {line}" for line in promise_lines({"promise": result})]
    out += [f"- {line}" for line in result.get("evidence", [])]
    return out
