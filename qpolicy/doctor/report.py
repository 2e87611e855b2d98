"""What a doctor run found: per lever, the calls, the online latency, the trainer's throughput;
the lever the daemon should use on this GPU; the table an operator reads; the cached JSON.

The recommendation prefers a *setting* (made once, enforced by the GPU) to a *per-request* lever
(a GSP round trip at every request). A lever qualifies if RM accepted every call, the trainer kept
95 % or more of its throughput next to the online stream without any lever, and it beat native
time-slicing's online p99 by 10 % or more. Of those, it takes the one nearest solo: the lowest of
the worse of p99 / (1.5 x solo's p99) and p50 / (1.2 x solo's p50), the online targets (issue 14).
On 2026-11-24 the lowest p99 alone picked a lever whose lead over the next was a few of the
phase's ~5 requests above its p99, while the p50s, measured on all of them, told the levers apart
(BENCHMARKS.md 2026-11-26). Without a solo baseline the p99 decides. A noisy solo p99 (over twice
its p50, which `make bench-gpu` refuses to divide a verdict by) still ranks: every lever is divided
by the same one; leaving the p99 out there picked, on a noisy H100 host, a lever with twice the
p99 of another for a p50 3 % lower (2026-11-26). The lever that sets the engine's own pair is kept
unless another qualifying one is more than 5 % nearer solo: a phase cannot tell levers closer than
that apart, and the engine's pair was chosen on longer runs.

A lever that sets offline contexts' compute preemption mode (CTA) measured next to a trainer of
short kernels qualifies only if the same run measured it next to the long-kernel trainer too
(LONG_TRAINER_N, the doctor's ``check`` phases) and it did no worse there than the engine's pair.
The daemon sets it on every offline pod of the GPU, whatever kernels they run: next to short
kernels CTA took the online p50 0.00-0.05 ms lower, and next to the 8192 trainer it doubled the p50
(H100 2026-11-26, 1.46 against 0.73 ms; H200 2026-12-03, 1.40 against 0.65 ms: docs/levers.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qpolicy.doctor.targets import P50_BOUND, P99_BOUND, TRAINER_FLOOR, stricter_solo
from qpolicy.enforcers.strategy import (
    DOCTOR_CACHE_NAME,
    DOCTOR_SCHEMA,
    PREEMPTION_LEVERS,
    TIMESLICE_LEVERS,
    doctor_cache_path,
    read_doctor_cache,
)
from qpolicy.engine import OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US
from qpolicy.runtime.atomicfile import write_atomically

CACHE_NAME = DOCTOR_CACHE_NAME
SCHEMA = DOCTOR_SCHEMA
# A lever must keep TRAINER_FLOOR of the trainer's co-located native throughput (targets.py)
# and beat native's online p99 by this much to be worth recommending; of those, the recommended
# lever is the nearest to the targets against solo (P50_BOUND, P99_BOUND).
MIN_GAIN = 0.10
# The lever that sets the engine's own pair: what a node runs without a doctor result, chosen on
# runs of 3 001 requests on several hosts (qpolicy/engine.py). A phase of a few hundred requests
# overrides it only by more than NOISE of its distance from solo: levers that set the same thing
# differed by that much between phases (2026-11-24, H100: timeslice, timeslice+rebuild and
# timeslice-1us at p50 0.90, 0.88 and 0.86 ms), and on 2026-11-26 (call AA) a phase picked the
# earlier 128 µs pair over it by 5 µs of p50 with a p99 0.06 ms worse.
DEFAULT_LEVERS = frozenset(
    name
    for name, pair in TIMESLICE_LEVERS.items()
    if pair == (OFFLINE_TIMESLICE_US, ONLINE_TIMESLICE_US) and name not in PREEMPTION_LEVERS
)
NOISE = 0.05
# The doctor's default trainer, of the longest kernels it measures (bf16 matmuls of 1.4-2 ms).
LONG_TRAINER_N = 8192
# The phases a short-kernel run adds for a compute preemption lever: the same lever, and the
# engine's pair, next to the long-kernel trainer. Never candidates themselves.
CHECK = "check"
# The kinds of phase a recommendation is chosen from (levers.py): not the baselines, the MPS
# comparison, experiments or the long-kernel checks.
LEVER_KINDS = ("setting", "per-request")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (as `make bench-gpu` computes them)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def latency_stats(values: Sequence[float]) -> dict[str, Any]:
    stats: dict[str, Any] = {"requests": len(values)}
    for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999)):
        value = percentile(values, q)
        stats[f"{name}_ms"] = None if value is None else round(value, 3)
    stats["mean_ms"] = round(sum(values) / len(values), 3) if values else None
    return stats


def calls_summary(calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per control: how often it was sent, the statuses RM answered, the median cost."""
    by_control: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_control.setdefault(call["control"], []).append(call)
    return {
        control: {
            "sent": len(items),
            "statuses": sorted({item["status"] for item in items}),
            "median_us": percentile([item["us"] for item in items], 0.5),
        }
        for control, items in sorted(by_control.items())
    }


def refused(phase: dict[str, Any]) -> bool:
    """Whether RM answered any of the phase's calls with other than NV_OK."""
    return any(s != "0x0" for c in phase["calls"].values() for s in c["statuses"])


def long_kernel_check(phases: Sequence[dict[str, Any]], lever: str) -> str | None:
    """Why the compute preemption ``lever`` fails its check next to the long-kernel trainer
    (its p50 or p99 more than NOISE above the engine's pair's there, its trainer under
    TRAINER_FLOOR of the pair's, a refusal or an error), or None where it passes."""
    checks = {p["lever"]: p for p in phases if p.get("kind") == CHECK}
    pair = next((checks[name] for name in sorted(DEFAULT_LEVERS) if name in checks), None)
    own = checks.get(lever)
    if own is None or pair is None:
        return f"not measured next to the {LONG_TRAINER_N} trainer"
    for phase in (own, pair):
        if phase.get("error") or refused(phase):
            return f"its check next to the {LONG_TRAINER_N} trainer failed ({phase['lever']})"
        if phase["online"].get("p50_ms") is None or phase["online"].get("p99_ms") is None:
            return f"its check next to the {LONG_TRAINER_N} trainer measured no requests"
    worse = [
        f"{key[:3]} {own['online'][key]:.2f} against {pair['online'][key]:.2f} ms"
        for key in ("p50_ms", "p99_ms")
        if own["online"][key] > pair["online"][key] * (1 + NOISE)
    ]
    kept, base = own.get("trainer_it_per_s") or 0.0, pair.get("trainer_it_per_s") or 0.0
    if base and kept < base * TRAINER_FLOOR:
        worse.append(f"trainer {kept / base:.0%} of the pair's")
    if worse:
        return (
            f"next to the {LONG_TRAINER_N} trainer it did worse than the engine's pair "
            f"({pair['lever']}): " + ", ".join(worse)
        )
    return None


# The online stream alone: before the trainer starts, and again after the levers with the
# trainer stopped (run.py).
SOLO_PHASES = ("solo", "solo-after")


def solo_phase(phases: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The solo phase the levers are held against: of the solo phases that measured both
    percentiles, the one targets.stricter_solo() picks, as `make bench-gpu` picks its rows';
    where none is stable, the first that measured. None without one."""
    measured = [
        p
        for p in phases
        if p["lever"] in SOLO_PHASES
        and not p.get("error")
        and p["online"].get("p50_ms")
        and p["online"].get("p99_ms")
    ]
    chosen = stricter_solo(
        [(float(p["online"]["p50_ms"]), float(p["online"]["p99_ms"])) for p in measured]
    )
    if chosen is not None:
        return measured[chosen]
    return measured[0] if measured else None


def recommend(phases: Sequence[dict[str, Any]], trainer_n: int = LONG_TRAINER_N) -> dict[str, Any]:
    """The lever the daemon should use, with the evidence, or why none. ``trainer_n``: the side
    of the run's trainer, whose kernels are short below LONG_TRAINER_N."""
    native = next((p for p in phases if p["lever"] == "native"), None)
    if native is None or native["online"].get("p99_ms") is None:
        return {"lever": None, "why": "no native baseline was measured"}
    base_p99 = native["online"]["p99_ms"]
    base_trainer = native.get("trainer_it_per_s") or 0.0
    baseline = solo_phase(phases)
    solo = baseline["online"] if baseline is not None else None
    candidates = []
    held_back: list[str] = []
    for phase in phases:
        if phase["kind"] not in LEVER_KINDS or phase.get("error"):
            continue
        if phase["lever"] in PREEMPTION_LEVERS and trainer_n < LONG_TRAINER_N:
            # Said whether or not it would have qualified: the operator learns what it does.
            failed = long_kernel_check(phases, phase["lever"])
            if failed is not None:
                held_back.append(f"{phase['lever']} held back: {failed}")
                continue
        p99 = phase["online"].get("p99_ms")
        keeps = (phase.get("trainer_it_per_s") or 0.0) / base_trainer if base_trainer else 0.0
        if p99 is None or refused(phase) or keeps < TRAINER_FLOOR:
            continue
        if p99 <= base_p99 * (1 - MIN_GAIN):
            p50 = phase["online"].get("p50_ms")
            score = _distance_from_solo(p50, p99, solo)
            candidates.append((phase["kind"] != "setting", score, p99, phase["lever"], keeps, p50))
    also = "".join(f"; {why}" for why in held_back)
    if not candidates:
        return {
            "lever": None,
            "why": f"no lever that RM accepted kept the trainer at {TRAINER_FLOOR:.0%} and beat "
            f"native's online p99 ({base_p99:.2f} ms) by {MIN_GAIN:.0%}" + also,
        }
    best = min(candidates)
    default = min((c for c in candidates if c[3] in DEFAULT_LEVERS), default=None)
    kept_default = default is not None and default != best and default[1] * (1 - NOISE) <= best[1]
    chosen = default if kept_default and default is not None else best
    per_request, score, p99, lever, keeps, p50 = chosen
    nearest = (
        ""
        if solo is None
        else f" (the nearest to solo's {solo['p50_ms']:.2f} / {solo['p99_ms']:.2f} ms: "
        f"{score:.2f} x the bound of its worse target)"
    )
    checked = {"long_kernels_checked": True} if lever in PREEMPTION_LEVERS else {}
    return {
        "lever": lever,
        "kind": "per-request" if per_request else "setting",
        **checked,
        "online_p50_ms": p50,
        "online_p99_ms": p99,
        "native_p99_ms": base_p99,
        "trainer_keeps": round(keeps, 3),
        "why": f"online p50 {_fmt(p50)} / p99 {p99:.2f} ms against native "
        f"{_ms(native['online'], 'p50_ms')} / {base_p99:.2f} ms{nearest}, trainer keeps "
        f"{keeps:.0%}"
        + (" (no setting did as well: a control at every request)" if per_request else "")
        + (
            f"; {best[3]} was within {NOISE:.0%} of it ({best[1]:.2f} x), not enough to leave "
            "the engine's default pair"
            if kept_default
            else ""
        )
        + also,
    }


def _distance_from_solo(p50: float | None, p99: float, solo: dict[str, Any] | None) -> float:
    """How far a lever's online latency is from the targets against ``solo`` (usable: both
    percentiles present): the worse of p99 / (1.5 x solo p99) and p50 / (1.2 x solo p50), 1 or
    less where both hold. Without a solo, the p99 itself (every candidate is then scored the
    same way)."""
    if solo is None:
        return p99
    by_p99 = p99 / (P99_BOUND * float(solo["p99_ms"]))
    by_p50 = math.inf if p50 is None else p50 / (P50_BOUND * float(solo["p50_ms"]))
    return max(by_p50, by_p99)


def _fecs_text(fecs: dict[str, Any] | None) -> str:
    """A phase's switches as the FECS trace showed them (qpolicy.nvrm.fecs.switches)."""
    if not fecs:
        return "-"
    restore, runs = fecs.get("restore_us"), fecs.get("online_run_us")
    text = f"{fecs.get('offline_to_online', 0)}"
    if restore:
        text += f" ({restore['p50']:.0f} / {restore['p99']:.0f})"
    if runs:
        text += f", {runs['p50']:.0f}"
    waits = (fecs.get("requests") or {}).get("to_save_end_us")
    if waits:
        text += f", {waits['p50']:.0f}"
    return text


def _ms(online: dict[str, Any], key: str) -> str:
    return _fmt(online.get(key))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(report: dict[str, Any]) -> list[str]:
    native: dict[str, Any] = next((p for p in report["phases"] if p["lever"] == "native"), {})
    base = native.get("trainer_it_per_s") or 0.0
    traced = any("fecs" in phase for phase in report["phases"])
    lines = [
        f"GPU {report['gpu'].get('index')}: {report['gpu'].get('name')}, driver "
        f"{report['gpu'].get('driver')}; {report['date']}",
        "",
        "| lever | kind | RM answered | cost per call | online p50 / p90 / p99 ms (n) | trainer "
        "it/s (of native) | trainer saves (WFI/CTA/CILP) |"
        + (
            " FECS: trainer to online (restore p50 / p99 µs), online runs p50 µs, launch to the "
            "trainer's save end p50 µs |"
            if traced
            else ""
        ),
        "|---|---|---|---|---|---|---|" + ("---|" if traced else ""),
    ]
    for phase in report["phases"]:
        online = phase["online"]
        statuses = sorted({s for c in phase["calls"].values() for s in c["statuses"]}) or ["-"]
        costs = [c["median_us"] for c in phase["calls"].values() if c["median_us"] is not None]
        cost = f"{max(costs):.0f} µs" if costs else "-"
        trainer = phase.get("trainer_it_per_s")
        # A check phase's trainer is another one (LONG_TRAINER_N): native's is not its baseline.
        keeps = f" ({trainer / base:.0%})" if trainer and base and phase["kind"] != CHECK else ""
        name = phase["lever"]
        if phase.get("trainer_n"):
            name += f" ({phase['trainer_n']} trainer)"
        saves = phase.get("trainer_saves") or {}
        save_text = (
            "/".join(str(saves.get(k, "-")) for k in ("wfi", "cta", "cilp")) if saves else "-"
        )

        lines.append(
            f"| {name} | {phase['kind']} | {', '.join(statuses)} | {cost} | "
            f"{_ms(online, 'p50_ms')} / {_ms(online, 'p90_ms')} / {_ms(online, 'p99_ms')} "
            f"({online.get('requests', 0)}) | "
            f"{'-' if trainer is None else f'{trainer:.1f}'}{keeps} | {save_text} |"
            + (f" {_fecs_text(phase.get('fecs'))} |" if traced else "")
            + (f" error: {phase['error']}" if phase.get("error") else "")
        )
    modes = report.get("preemption_modes") or {}
    if modes:
        lines += [
            "",
            "compute preemption modes: " + ", ".join(f"{k} {v}" for k, v in modes.items()),
        ]
    rec = report["recommendation"]
    lines += ["", f"recommended online lever: {rec.get('lever') or 'none'} ({rec['why']})"]
    lines += [f"note: {note}" for note in report.get("notes", [])]
    return lines


cache_path = doctor_cache_path


def write_cache(state_dir: Path, report: dict[str, Any]) -> Path:
    path = cache_path(state_dir, int(report["gpu"]["index"]))
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(report, indent=1).encode(), prefix=".doctor.")
    return path


read_cache = read_doctor_cache
