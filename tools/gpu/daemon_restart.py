"""Whether the rm enforcer keeps governing pods across restarts: the daemon killed, started again.

A daemon killed with SIGKILL sends nothing on its way out: a pod it had closed stays closed until
the next daemon's recovery (qpolicy/enforcers/rm/record.py) re-opens it, and the processes the
next daemon finds were started before its probe, whose RM handles it never saw
(qpolicy/backends/rm.py: "started before the probe"). Does a pod then keep its share, and is none
left stuck, closed for good?

Two offline pods under fixed-share, ``a`` (70) and ``b`` (30), each one 8192 trainer
(tools/gpu/matmul.py --timeline) started while the first daemon runs. The daemon is then killed
``--kills`` times, each time left up for a random time (alternately long, ``--up-s``, and short,
0.05-0.5 s after its probe came up: the first turns after a start, when it first closes a pod),
down ``--down-s``, and started again on the same state directory. A last daemon is stopped with
SIGTERM (a clean shutdown, which re-opens every channel) and the trainers run ``--tail-s`` more
alone. From the trainers' timelines, per window, each trainer's matmuls/s and a's share of the
pair:

- **up** (a daemon's probe up ``--settle-s``, to its kill; from its last find instead where it
  searched RM for the trainers: its status's ``last_found_at``, and such a life is kept up its
  planned time from the find, ``kill_at``): governed if a's share is
  0.70 +- 0.05 (native time-slicing gives the two ~0.50), read over the window's whole periods
  where the pair takes turns (a window holding none is too short to judge); stuck if a trainer
  finished nothing in a window of 1.5 s or more;
- **down** (the kill to the next daemon's probe up): reported only, with the longest time a
  trainer finished nothing in it; a pod closed at the kill stays closed until the dead daemon's
  guard re-opens it as the exit begins (qpolicy/enforcers/rm/guard.py), or, in a tree without
  the guard, until the next daemon starts;
- **final** (the last daemon, judged as an up window) and **tail** (no daemon, after SIGTERM):
  both trainers must run, a's share 0.50 +- 0.10 (every channel open, timeslices restored).

``--trainers-first`` starts the trainers before the first daemon: no daemon ever sees their
allocations, and each must find their RM objects by asking RM (qpolicy/enforcers/rm/unseen.py),
or adopt what the one before it found. ``--daemon-before S`` first runs a daemon S seconds and
stops it before the trainers start, as in a restart: it leaves a mark (a client it made itself),
and the next daemon searches the clients made since first; without it the first daemon searches
every client handle. ``--clients-between N`` then makes and frees N RM clients after the
trainers start, as monitoring does on a node: the search, newest client first, has that many more
handles to check before it reaches the trainers'.

``--configured-after S`` runs a daemon S seconds after the trainers start, with their pods not
configured yet, and stops it: its mark (a client it made at its first look) lies above the
trainers' clients. The pods are configured only then, as annotations added to a running
deployment are. The next daemon finds nothing above that mark and must search below it, which it
does where it can check client handles without a kernel log line (unseen.py).

``--qpolicy-root`` runs the daemon from another checkout (an older one, to compare); the trainers
and this tool stay this repository's.

As root on a GPU machine with PyTorch and the probe's bcc (tools/gpu/bcc-env.sh):

    python3 tools/gpu/daemon_restart.py --gpu 0 --out restart.json
    python3 tools/gpu/daemon_restart.py --table restart.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import lzma
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from qpolicy.enforcers.rm.handles import HANDLES_NAME  # noqa: E402
from qpolicy.enforcers.strategy import doctor_cache_path  # noqa: E402
from qpolicy.model import GpuConfig, GpuPolicy, PodClass, PodSpec  # noqa: E402
from qpolicy.state import DesiredState, StateStore, default_state_dir  # noqa: E402
from tools.bench.gpu import (  # noqa: E402
    INIT_S,
    MATMUL,
    Cgroups,
    cpu_seconds,
    free_port,
    in_cgroup,
    place_doctor_cache,
    probe_up,
    rate_between,
)
from tools.gpu.hostinfo import host_facts  # noqa: E402

PODS = {"a": 70, "b": 30}
N = 8192
SYNC_EVERY = 8  # matmul.py's default: one timeline point per 8 matmuls
# a's share of the pair when the daemon governs (its 70 of 70 + 30), and when nothing does: the
# driver time-slices two equal trainers evenly.
GOVERNED_SHARE = 0.70
NATIVE_SHARE = 0.50
SHARE_TOLERANCE = 0.05
TAIL_TOLERANCE = 0.10
# A window shorter than this holds too few periods to read a share from. Where the pair takes
# turns, a window is read over its whole periods (whole_periods): the rm enforcer's turns are
# 400 ms at the shortest, and at 70/30 its periods ran 0.8 s on an H100 (call 28B) and 1.2-1.6 s
# on H200s (a 1.1-1.2 s, b 0.4-0.5 s in call 29C's timelines).
MIN_WINDOW_S = 0.5
# A run of batches by one trainer shorter than this, inside a window, is not a turn: both were
# open and the driver interleaved them.
TURN_MIN_S = 0.15
# The most a searching life is kept up beyond its plan, so that its window from the find keeps
# its planned length (kill_at); the searches found the trainers 1.1-1.5 s after the probe
# (calls 28B, 28D, 29B).
SEARCH_EXTENSION_MAX_S = 3.0
# A trainer that finishes no batch of 8 (~13 ms alone) in this long is stopped, not slowed: its
# longest wait under 70/30 is a's turn, 0.56 s at the H100's 0.8 s period (call 28B) and up to
# 1.2 s on the H200s of call 29C.
STUCK_MIN_S = 1.5
# A pod that did less than this share of the pair's matmuls in a window with no daemon was
# stopped for most of it.
PAUSED_SHARE = 0.05
SHORT_UP_S = (0.05, 0.5)
# What a daemon takes to start on the GPU host (bcc compiles the probe), before anything measured
# it; a restart's budget is what the first start took, with this much room.
ASSUMED_STARTUP_S = 4.0
STARTUP_ROOM = 1.25
STARTUP_EXTRA_S = 0.5
# From SIGKILL or SIGTERM to the daemon's exit, budgeted: 14.7-15.3 s on an H200 (call 22A,
# 2026-12-01; the kernel's teardown of the probe, measured by tools/gpu/probe_teardown.py), and
# the next daemon starts only once the last has exited (as systemd restarts it).
EXIT_S = 16.0
# Trainer time beyond the plan, and the wait for their results after it.
MARGIN_S = 3.0
COLLECT_S = 60.0
PROBE_UP_WAIT_S = 60.0
# With --trainers-first: how long the trainers run before the first daemon starts.
TRAINERS_FIRST_LEAD_S = 2.0
TERM_WAIT_S = 30.0
LOG_TAIL = 40
# How often the daemon's CPU time is read: a search's 5 % of the daemon's time shows as a second or
# more at 5 % of a core.
CPU_EVERY_S = 0.5
# Log lines about what a daemon found of its predecessor and of processes older than its probe.
# The guard's line once it has undone a dead daemon's changes (qpolicy/enforcers/rm/guard.py).
GUARD_LINE = re.compile(
    r"(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING guard: daemon \d+ died without "
    r"undoing its changes: .* in (?P<recovery>[0-9.]+) ms"
)
LOG_MARKS = (
    "re-opened",
    "guard",
    "adopted",
    "cannot govern",
    "started before the probe",
    "found by asking RM",
    "found none of its channels",
)


# -- the plan --------------------------------------------------------------------------------------


def up_times(
    kills: int,
    seed: int,
    long_s: tuple[float, float],
    short_s: tuple[float, float] = SHORT_UP_S,
) -> list[tuple[str, float]]:
    """How long each killed daemon is left up: (``"long"`` or ``"short"``, seconds), alternating
    from a long one, drawn uniformly from ``long_s`` and ``short_s`` by a generator seeded with
    ``seed`` (the same schedule for the same seed, to rerun or compare checkouts). The first is
    long because the first daemon's time counts from the trainers' start, which its window needs
    to read a share."""
    rng = random.Random(seed)
    schedule = []
    for life in range(kills):
        kind, (low, high) = ("long", long_s) if life % 2 == 0 else ("short", short_s)
        schedule.append((kind, round(rng.uniform(low, high), 3)))
    return schedule


def startup_budget(startup_s: float) -> float:
    """What a restart is allowed for its start-up, from one that took ``startup_s``."""
    return startup_s * STARTUP_ROOM + STARTUP_EXTRA_S


def trainer_seconds(
    schedule: list[tuple[str, float]],
    down_s: float,
    final_up_s: float,
    tail_s: float,
    startup_s: float,
    exit_s: float = EXIT_S,
) -> float:
    """How long the trainers run from their common start: each killed daemon's time up, each
    restart's time down (its exit, ``exit_s``, or ``down_s`` if longer) and its start-up
    (``startup_s``, budgeted), the final daemon, its exit and the tail. The first daemon is up
    before they start, so its start-up is not in it."""
    restarts = len(schedule)
    return (
        sum(up for _, up in schedule)
        + restarts * (max(down_s, exit_s) + startup_budget(startup_s))
        + final_up_s
        + exit_s
        + tail_s
        + MARGIN_S
    )


def estimate_s(
    schedule: list[tuple[str, float]],
    down_s: float,
    final_up_s: float,
    tail_s: float,
    startup_s: float = ASSUMED_STARTUP_S,
    exit_s: float = EXIT_S,
) -> float:
    """The whole run: the first start-up, the trainers' CUDA start, their run, their results."""
    run = trainer_seconds(schedule, down_s, final_up_s, tail_s, startup_s, exit_s)
    return startup_s + INIT_S + run + MARGIN_S


# -- the analysis ----------------------------------------------------------------------------------


def batches(result: dict[str, Any], start: float, end: float) -> int | None:
    """The batches of ``SYNC_EVERY`` matmuls a trainer finished from wall-clock ``start`` to
    ``end``, or None for a trainer that reported nothing. A timeline with no point at all is a
    trainer that ran and finished nothing: 0, not unknown."""
    timeline = result.get("timeline")
    wall_start = result.get("wall_start")
    if not isinstance(timeline, list) or not isinstance(wall_start, int | float):
        return None
    if not timeline or end <= start:
        return 0
    rate = rate_between(result, start - wall_start, end - wall_start, SYNC_EVERY)
    assert rate is not None
    return round(rate * (end - start) / SYNC_EVERY)


def longest_gap(result: dict[str, Any], start: float, end: float) -> float | None:
    """The longest time from ``start`` to ``end`` (wall clock) in which a trainer finished no
    batch: how long a pod was stopped at most (a closed pod finishes nothing), or None for a
    trainer that reported nothing."""
    timeline = result.get("timeline")
    wall_start = result.get("wall_start")
    if not isinstance(timeline, list) or not isinstance(wall_start, int | float):
        return None
    if end <= start:
        return 0.0
    points = [start, *(wall_start + t for t in timeline if start < wall_start + t < end), end]
    return max(later - earlier for earlier, later in itertools.pairwise(points))


def turns(
    trainers: dict[str, dict[str, Any]], start: float, end: float
) -> list[tuple[str, float, float]] | None:
    """The trainers' turns from ``start`` to ``end`` (wall clock), read from their timelines: runs
    of batches by one trainer, each (name, first batch, last batch). None where the pair did not
    take turns: a run inside the window shorter than TURN_MIN_S (both open: the driver
    interleaves them batch by batch) or a trainer without a timeline."""
    points: list[tuple[float, str]] = []
    for name in PODS:
        result = trainers.get(name, {})
        timeline, wall_start = result.get("timeline"), result.get("wall_start")
        if not isinstance(timeline, list) or not isinstance(wall_start, int | float):
            return None
        points += [(wall_start + t, name) for t in timeline if start <= wall_start + t < end]
    runs: list[tuple[str, float, float]] = []
    for moment, name in sorted(points):
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1], moment)
        else:
            runs.append((name, moment, moment))
    # The first and last runs may be cut by the window's edges; every other one is a whole turn.
    if any(last - first < TURN_MIN_S for _, first, last in runs[1:-1]):
        return None
    return runs


def whole_periods(runs: list[tuple[str, float, float]]) -> tuple[float, float, int] | None:
    """The span of whole periods in ``runs`` (turns, as :func:`turns` reads them): from the
    start of the first whole turn to the start of the last turn of the same trainer, with the
    number of periods in it; None if it holds none. A turn starts midway between the other
    trainer's last batch and its own first one."""
    starts = [
        (name, (runs[i - 1][2] + first) / 2) for i, (name, first, _) in enumerate(runs) if i > 0
    ]
    if not starts:
        return None
    leader = starts[0][0]
    mine = [moment for name, moment in starts if name == leader]
    if len(mine) < 2:
        return None
    return mine[0], mine[-1], len(mine) - 1


def window(
    kind: str,
    life: int | None,
    start: float,
    end: float,
    trainers: dict[str, dict[str, Any]],
    origin: float,
) -> dict[str, Any]:
    """One window's rates and verdict. ``kind``: "up" and "final" (a daemon governs: a's share
    0.70, no trainer stopped), "down" (no daemon since a kill: reported, not judged) or "tail"
    (no daemon since a clean stop: both run, a's share 0.50). Times are wall-clock; ``origin``
    (the trainers' start) is what the from/to seconds count from."""
    seconds = end - start
    done = {name: batches(trainers.get(name, {}), start, end) for name in PODS}
    rates = {
        name: None if n is None or seconds <= 0 else n * SYNC_EVERY / seconds
        for name, n in done.items()
    }
    share = None
    a, b = rates["a"], rates["b"]
    if a is not None and b is not None and a + b > 0:
        share = a / (a + b)
    out: dict[str, Any] = {
        "kind": kind,
        "life": life,
        "start": start,
        "end": end,
        "from_s": round(start - origin, 3),
        "to_s": round(end - origin, 3),
        "seconds": round(seconds, 3),
        "it_per_s": {k: None if v is None else round(v, 1) for k, v in rates.items()},
        "batches": done,
        "longest_gap_s": {
            name: None if gap is None else round(gap, 3)
            for name in PODS
            for gap in [longest_gap(trainers.get(name, {}), start, end)]
        },
        "share_a": None if share is None else round(share, 4),
        "too_short": seconds < MIN_WINDOW_S,
        "governed": None,
        "looks_ungoverned": None,
        "stuck": [],
        "closed": [],
        "ok": None,
    }
    if None in done.values():
        out["verdict"] = "no data"
        out["ok"] = False if kind in ("up", "final", "tail") and not out["too_short"] else None
        return out
    stopped = sorted(name for name, n in done.items() if n == 0)
    if kind == "unconfigured":
        # The pods were not configured: no daemon governs them, nothing to judge.
        out["verdict"] = "not configured"
        return out
    if kind == "down":
        # A pod closed at the kill stays so until the guard or the next daemon recovers: reported.
        # It may run a little before the window ends (the next daemon re-opens it as it starts,
        # before its probe is up), so a pod with under PAUSED_SHARE of the pair's matmuls counts
        # as paused.
        total = sum(n for n in done.values() if n is not None)
        paused = sorted(
            name for name, n in done.items() if n is not None and n < PAUSED_SHARE * total
        )
        out["closed"] = paused
        out["verdict"] = f"{', '.join(paused)} paused" if paused else "both ran"
        return out
    if out["too_short"]:
        out["verdict"] = "too short"
        if kind == "tail":
            out["ok"] = False  # the tail is required: without it, nothing says all re-opened
            out["verdict"] = "TOO SHORT"
        return out
    if kind == "tail" or seconds >= STUCK_MIN_S:
        out["stuck"] = stopped
    if kind in ("up", "final") and not out["stuck"]:
        # A share read over part of a period is off by up to a turn's worth: a 70/30 pair at
        # ~1.6 s periods read 0.635 over 1.2 s and 0.800 over 2.4 s (calls 29B, 29C); over
        # whole periods every governed window kept (22E-29C, both GPUs) read 0.694-0.713. So
        # where the pair took turns, the share is read over the window's whole periods; a
        # window with none is too short to judge.
        runs = turns(trainers, start, end)
        span = whole_periods(runs) if runs is not None else None
        if runs is not None and span is None:
            out["too_short"] = True
            out["verdict"] = "too short (no whole period)"
            return out
        if span is not None:
            first, last, periods = span
            inside = {name: batches(trainers.get(name, {}), first, last) for name in PODS}
            total = sum(n or 0 for n in inside.values())
            share = (inside["a"] or 0) / total if total else None
            out["whole_periods"] = {
                "from_s": round(first - origin, 3),
                "to_s": round(last - origin, 3),
                "periods": periods,
                "share_a": None if share is None else round(share, 4),
            }
    if kind == "tail":
        restored = share is not None and abs(share - NATIVE_SHARE) <= TAIL_TOLERANCE
        out["ok"] = restored and not stopped
        if stopped:
            out["verdict"] = f"STUCK: {', '.join(stopped)}"
        else:
            out["verdict"] = "restored" if restored else "NOT RESTORED"
        return out
    out["governed"] = share is not None and abs(share - GOVERNED_SHARE) <= SHARE_TOLERANCE
    out["looks_ungoverned"] = share is not None and abs(share - NATIVE_SHARE) <= SHARE_TOLERANCE
    out["ok"] = out["governed"] and not out["stuck"]
    if out["stuck"]:
        out["verdict"] = f"STUCK: {', '.join(out['stuck'])}"
    elif out["governed"]:
        out["verdict"] = "governed"
    elif out["looks_ungoverned"]:
        out["verdict"] = "UNGOVERNED (native-like)"
    else:
        out["verdict"] = "OFF TARGET"
    return out


def _trainers_end(report: dict[str, Any]) -> float | None:
    """When the first trainer to end ended (its own clock), or the planned end if none said."""
    ends = [
        r["wall_start"] + r["seconds"]
        for r in report.get("trainers", {}).values()
        if isinstance(r.get("wall_start"), int | float)
        and isinstance(r.get("seconds"), int | float)
    ]
    if ends:
        return float(min(ends))
    planned = report.get("planned_end")
    return float(planned) if planned is not None else None


def found_at(life: dict[str, Any]) -> float | None:
    """When (wall clock) the life's searches of RM last found a process's channels, from its own
    status as read at its kill or stop; None if it found nothing (or its status is not its
    own). What a search finds is governed from then, not from the probe's start."""
    status = life.get("status")
    if not isinstance(status, dict) or not life.get("status_is_its_own"):
        return None
    backend = status.get("backend")
    searched = backend.get("searched") if isinstance(backend, dict) else None
    found = searched.get("last_found_at") if isinstance(searched, dict) else None
    return float(found) if isinstance(found, int | float) else None


def kill_at(life: dict[str, Any], up_s: float, planned: float) -> float:
    """When to kill a life planned to end at ``planned`` (its probe's start plus ``up_s``): a
    life that searched RM for its processes governs them from the find, so it is given its
    ``up_s`` from the find instead (at most SEARCH_EXTENSION_MAX_S more), and its window is as
    long as planned. Without it, call 29B's searching life (up 3.4 s, the find 1.1 s after its
    probe) left a 1.2 s window, 1.5 turns of a period, which a share cannot be read from."""
    found = found_at(life)
    probe_up = life.get("probe_up")
    if found is None or not isinstance(probe_up, int | float) or found <= probe_up:
        return planned
    return min(max(planned, found + up_s), planned + SEARCH_EXTENSION_MAX_S)


def windows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every window of a run, in time order, from its lives and trainers (``report`` as main
    writes it: lives with probe_up, killed or stopped, exited; the trainers' results)."""
    trainers: dict[str, dict[str, Any]] = report.get("trainers", {})
    settle = float(report.get("args", {}).get("settle_s", 1.0))
    starts = [
        r["wall_start"] for r in trainers.values() if isinstance(r.get("wall_start"), int | float)
    ]
    # The windows start where both trainers run (each starts at --start-at, within ms).
    begin = max(starts) if starts else report.get("start_at")
    if begin is None:
        return []
    origin = min(starts) if starts else begin
    end_of_run = _trainers_end(report)
    lives: list[dict[str, Any]] = report.get("lives", [])
    out = []
    for index, life in enumerate(lives):
        probe_up = life.get("probe_up")
        # Killed as planned, stopped as the final one, or stopped by the cleanup of a run that
        # failed (then an up window to its stop, and no tail: what followed was no plan's).
        ended = life.get("killed") or life.get("stopped")
        if probe_up is None or ended is None or life.get("kind") == "before":
            continue  # a daemon stopped before the trainers started governs no window
        if life.get("kind") == "unconfigured":
            # Its pods were not configured yet: reported (native-like), not judged.
            start = max(probe_up, begin)
            item = window("unconfigured", index, start, max(ended, start), trainers, origin)
            item["life_kind"] = life.get("kind")
            out.append(item)
            continue
        kind = "final" if life.get("kind") == "final" else "up"
        governs_from = probe_up
        found = found_at(life)
        if found is not None and probe_up < found < ended:
            # Processes it had to search RM for: governed from the find (the search's own time
            # is reported, not judged as a share).
            governs_from = found
        start = max(governs_from, begin) + settle
        item = window(kind, index, start, max(ended, start), trainers, origin)
        item["life_kind"] = life.get("kind")
        item["found_after_s"] = None if found is None else round(found - probe_up, 3)
        out.append(item)
        if life.get("killed"):
            later = lives[index + 1] if index + 1 < len(lives) else {}
            down_end = later.get("probe_up") or end_of_run
            if down_end is not None and down_end > life["killed"]:
                out.append(window("down", index, life["killed"], down_end, trainers, origin))
    final = lives[-1] if lives else {}
    stopped = final.get("exited") or final.get("stopped")
    if final.get("kind") == "final" and not final.get("killed") and stopped and end_of_run:
        start = stopped + settle
        out.append(window("tail", None, start, max(end_of_run, start), trainers, origin))
    return out


def daemon_cpu(samples: list[list[float]], window_s: float = 1.0) -> dict[str, float] | None:
    """A daemon life's CPU, in % of one core, from its samples ([time, CPU seconds], from its
    probe up): the mean over the life, and the most over any ``window_s`` or more of it (a
    search's share shows there)."""
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return None
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    peak = 0.0
    start = 0
    for end in range(1, len(samples)):
        # The shortest span of window_s or more that ends at this sample.
        while start + 1 < end and samples[end][0] - samples[start + 1][0] >= window_s:
            start += 1
        span = samples[end][0] - samples[start][0]
        if span >= window_s:
            peak = max(peak, (samples[end][1] - samples[start][1]) / span)
    return {
        "seconds": round(t1 - t0, 2),
        "mean_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
        "peak_pct": round(100 * peak, 2),
    }


def guard_acted(life: dict[str, Any]) -> dict[str, float] | None:
    """For a killed life: how long after the SIGKILL its guard logged that it had undone the dead
    daemon's changes (``after_kill_ms``, the log line's millisecond time against the kill's) and
    what it said the undoing took (``recovery_ms``); None without that line. The guard's time is
    its host's local time (logging's asctime), read here as this machine's: both run in UTC."""
    killed = life.get("killed")
    if not isinstance(killed, int | float):
        return None
    for line in life.get("marks", []):
        match = GUARD_LINE.match(line)
        if match is None:
            continue
        stamp = datetime.datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return {
            "after_kill_ms": round((stamp - killed) * 1000, 1),
            "recovery_ms": float(match["recovery"]),
        }
    return None


def summarise(report: dict[str, Any], found: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict over every window: governed in every up window judged, none stuck, the tail
    restored, no trainer error, no error in the run."""
    judged = [w for w in found if w["kind"] in ("up", "final") and not w["too_short"]]
    tail = next((w for w in found if w["kind"] == "tail"), None)
    errors = {
        name: result["error"]
        for name, result in report.get("trainers", {}).items()
        if "error" in result
    }
    missing = sorted(set(PODS) - set(report.get("trainers", {})))
    errors.update({name: ["no result"] for name in missing})
    startups = [life["startup_s"] for life in report.get("lives", []) if life.get("startup_s")]
    summary: dict[str, Any] = {
        "up_windows": len(judged),
        "too_short": sum(1 for w in found if w["kind"] in ("up", "final") and w["too_short"]),
        "governed": sum(1 for w in judged if w["governed"]),
        "looks_ungoverned": sum(1 for w in judged if w["looks_ungoverned"]),
        "stuck": sum(1 for w in judged if w["stuck"]),
        "down_windows_paused": sum(1 for w in found if w["kind"] == "down" and w["closed"]),
        # Per down window, the longest a trainer finished nothing: a pod closed at the kill
        # stands until the dead daemon's guard, or the next daemon, opens it.
        "down_longest_gap_s": [
            max((g for g in w["longest_gap_s"].values() if g is not None), default=None)
            for w in found
            if w["kind"] == "down"
        ],
        # Per killed life: when its guard had undone its changes, and how long that took.
        "guard": [
            acted
            for life in report.get("lives", [])
            for acted in [guard_acted(life)]
            if acted is not None
        ],
        # Per life that searched RM: its find, in seconds after its probe came up.
        "found_after_s": [w["found_after_s"] for w in found if w.get("found_after_s") is not None],
        "tail_share": None if tail is None else tail["share_a"],
        "tail_ok": None if tail is None else tail["ok"],
        "tail_stuck": [] if tail is None else tail["stuck"],
        "trainer_errors": errors,
        "kills": sum(1 for life in report.get("lives", []) if life.get("killed")),
        # Fewer kills than asked (the start-ups were slower than budgeted): not a failure, what
        # was measured still holds; said beside the verdict.
        "cut_short": report.get("cut_short"),
        "daemon_cpu": {
            str(life["life"]): daemon_cpu(life.get("cpu") or []) for life in report.get("lives", [])
        },
        "startup_s": None
        if not startups
        else {
            "min": round(min(startups), 2),
            "mean": round(statistics.fmean(startups), 2),
            "max": round(max(startups), 2),
        },
    }
    failures = []
    if errors:
        failures.append(f"trainer errors: {', '.join(sorted(errors))}")
    for error in report.get("errors", []):
        failures.append(f"the run failed: {error}")
    if not judged:
        failures.append("no up window long enough to judge")
    elif summary["governed"] < len(judged):
        failures.append(
            f"{len(judged) - summary['governed']} of {len(judged)} up windows not governed"
        )
    if summary["stuck"]:
        failures.append(f"{summary['stuck']} up window(s) with a stuck trainer")
    if tail is None:
        failures.append("no tail window")
    elif not tail["ok"]:
        failures.append(f"tail: {tail['verdict']}")
    summary["failures"] = failures
    summary["holds"] = not failures
    return summary


def analyse(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with its windows and summary computed again from its lives and trainers."""
    report["windows"] = windows(report)
    report["summary"] = summarise(report, report["windows"])
    return report


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _whole(window: dict[str, Any]) -> str:
    """The share over a window's whole periods, where it was judged on them."""
    whole = window.get("whole_periods")
    if not isinstance(whole, dict):
        return ""
    return (
        f"; {_cell(whole.get('share_a'), 3)} over {whole.get('periods')} whole period(s), "
        f"{_cell(whole.get('from_s'))}-{_cell(whole.get('to_s'))} s"
    )


def table(report: dict[str, Any]) -> list[str]:
    """The windows one a line, then the summary and the verdict."""
    lines = [
        "| window | life | s from start | a mm/s | b mm/s | a's share | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in report.get("windows", []):
        kind = w["kind"] if not w.get("life_kind") else f"{w['kind']} ({w['life_kind']})"
        life = "-" if w["life"] is None else str(w["life"])
        lines.append(
            f"| {kind} | {life} | {w['from_s']:.1f}-{w['to_s']:.1f} | "
            f"{_cell(w['it_per_s']['a'])} | {_cell(w['it_per_s']['b'])} | "
            f"{_cell(w['share_a'], 3)}{_whole(w)} | {w['verdict']} |"
        )
    s = report.get("summary", {})
    startup = s.get("startup_s")
    tail = "-" if s.get("tail_share") is None else f"{s['tail_share']:.3f}"
    errors = ", ".join(f"{k}: {' / '.join(v)}" for k, v in s.get("trainer_errors", {}).items())
    lines += [
        "",
        f"up windows judged {s.get('up_windows', 0)} (too short {s.get('too_short', 0)}): "
        f"governed {s.get('governed', 0)}, ungoverned-looking {s.get('looks_ungoverned', 0)}, "
        f"stuck {s.get('stuck', 0)}; down windows with a pod paused "
        f"{s.get('down_windows_paused', 0)}; tail share {tail}",
        "processes found by searching RM, s after the probe up: "
        + (", ".join(f"{g:.2f}" for g in s.get("found_after_s", [])) or "-"),
        "the guard's line after each SIGKILL (its recovery): "
        + (
            ", ".join(
                f"{g['after_kill_ms']:.1f} ms ({g['recovery_ms']:g} ms)" for g in s.get("guard", [])
            )
            or "-"
        ),
        "longest a trainer finished nothing, per down window: "
        + (", ".join(f"{_cell(g, 2)} s" for g in s.get("down_longest_gap_s", [])) or "-"),
        f"kills {s.get('kills', 0)}; daemon start-up "
        + ("-" if not startup else f"{startup['min']}-{startup['max']} s (mean {startup['mean']})")
        + f"; trainer errors {errors or 'none'}"
        + (f"; cut short {s['cut_short']}" if s.get("cut_short") else ""),
        "daemon CPU, % of a core from probe up (mean / most over 1 s): "
        + (
            ", ".join(
                f"life {n} {c['mean_pct']:.1f} / {c['peak_pct']:.1f} over {c['seconds']:.0f} s"
                if c
                else f"life {n} -"
                for n, c in s.get("daemon_cpu", {}).items()
            )
            or "-"
        ),
        "verdict: " + ("HOLDS" if s.get("holds") else "FAILS: " + "; ".join(s.get("failures", []))),
    ]
    return lines


def handles_left(path: Path) -> dict[str, Any] | None:
    """What a daemon left its successor in its handles file: the mark (``newest_client``), and
    each process's client handles (whether a find lay below the mark). None if unreadable."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    processes = document.get("processes")
    clients = {}
    for proc in processes if isinstance(processes, list) else []:
        if isinstance(proc, dict) and isinstance(proc.get("clients"), list):
            clients[str(proc.get("pid"))] = [
                c.get("handle") for c in proc["clients"] if isinstance(c, dict)
            ]
    return {"mark": document.get("newest_client"), "clients": clients}


def log_marks(text: str) -> list[str]:
    """The log's lines about recovery and processes older than the probe (LOG_MARKS), matched
    without regard to case (the marks are written as the daemon writes them, "RM" included)."""
    marks = [m.lower() for m in LOG_MARKS]
    return [line for line in text.splitlines() if any(m in line.lower() for m in marks)]


# -- running it ------------------------------------------------------------------------------------


def daemon_command(
    root: Path, port: int, state_dir: Path, debug: bool, environ: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The daemon's argv and environment, as tools/bench/gpu.py starts it, with ``root``'s
    package first on its path (the daemon runs with ``cwd=root``)."""
    argv = [
        sys.executable, "-m", "qpolicy", "daemon", "--enforcer", "rm",
        "--metrics-addr", f"127.0.0.1:{port}", "--log-level", "debug" if debug else "info",
    ]  # fmt: skip
    path = ":".join(p for p in (str(root), environ.get("PYTHONPATH", "")) if p)
    return argv, {**environ, "QPOLICY_STATE_DIR": str(state_dir), "PYTHONPATH": path}


def desired_state(cgroup_ids: dict[str, str], gpu: int) -> DesiredState:
    """Fixed-share on ``gpu``, with the pods of ``cgroup_ids`` (a at 70, b at 30), each named by
    its cgroup (as tools/bench/gpu.py's Cgroups.id gives them): none yet for an empty one."""
    state = DesiredState().with_gpu(GpuConfig(gpu, GpuPolicy.FIXED_SHARE))
    for name, cgroup in cgroup_ids.items():
        state = state.with_pod(PodSpec(cgroup, gpu, PodClass.OFFLINE, PODS[name]))
    return state


def _commit(root: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _gpu_name(gpu: int) -> str:
    with contextlib.suppress(OSError):
        return subprocess.run(
            ["nvidia-smi", "-i", str(gpu), "--query-gpu=name,driver_version",
             "--format=csv,noheader"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
    return ""


def age_clients(count: int) -> dict[str, Any]:
    """Make and free ``count`` RM clients (each a root client on a /dev/nvidiactl of its own);
    the handles of the first and last, and the time it took."""
    from qpolicy.nvrm import rmctl

    t0 = time.time()
    first = last = None
    for _ in range(count):
        last = rmctl.newest_client_handle()
        first = first if first is not None else last
    return {
        "count": count,
        "first": None if first is None else f"{first:#x}",
        "last": None if last is None else f"{last:#x}",
        "seconds": round(time.time() - t0, 3),
    }


class Run:
    """The daemons and trainers of one run, and what is known of them: whatever happens, stop()
    leaves no daemon or trainer running."""

    def __init__(
        self,
        args: argparse.Namespace,
        state_dir: Path,
        report: dict[str, Any],
        cgroups: Cgroups | None = None,
    ) -> None:
        self.args = args
        self.state_dir = state_dir
        self.report = report
        self.cgroups = cgroups if cgroups is not None else Cgroups()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.life: dict[str, Any] | None = None
        self.trainers: dict[str, subprocess.Popen[bytes]] = {}
        self._stop_cpu = threading.Event()
        self._sampler: threading.Thread | None = None

    # -- daemons -----------------------------------------------------------------------------

    def start_daemon(self, kind: str, planned_up_s: float) -> dict[str, Any]:
        """Start a daemon life on the state directory and wait for its probe."""
        number = len(self.report["lives"])
        port = free_port()
        argv, env = daemon_command(
            self.args.qpolicy_root, port, self.state_dir, self.args.daemon_logs, dict(os.environ)
        )
        log_path = self.state_dir / f"daemon-{number}.log"
        life: dict[str, Any] = {
            "life": number, "kind": kind, "planned_up_s": planned_up_s, "port": port,
            "log": str(log_path), "started": time.time(),
        }  # fmt: skip
        self.report["lives"].append(life)
        # A file, not a pipe: a chatty daemon (debug) must never block on a pipe nobody reads.
        # Its own session: a Ctrl-C here reaches this tool alone, which stops the daemon itself.
        with log_path.open("wb") as log_file:
            self.daemon = subprocess.Popen(
                argv, cwd=self.args.qpolicy_root, env=env, stdout=subprocess.DEVNULL,
                stderr=log_file, start_new_session=True,
            )  # fmt: skip
        self.life = life
        life["pid"] = self.daemon.pid
        deadline = time.time() + PROBE_UP_WAIT_S
        while True:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"daemon life {number} exited with {self.daemon.returncode}")
            if time.time() > deadline:
                raise RuntimeError(f"daemon life {number}: no probe up in {PROBE_UP_WAIT_S:g} s")
            if probe_up(port):
                break
            # Often: the start-up time is a result, and a short life counts from this moment.
            time.sleep(0.05)
        life["probe_up"] = time.time()
        life["startup_s"] = round(life["probe_up"] - life["started"], 3)
        life["cpu"] = []
        self._stop_cpu.clear()
        self._sampler = threading.Thread(
            target=self._sample_cpu, args=(self.daemon.pid, life["cpu"]), daemon=True
        )
        self._sampler.start()
        return life

    def _sample_cpu(self, pid: int, samples: list[list[float]]) -> None:
        """Every CPU_EVERY_S while the daemon runs: [time, its CPU seconds (user + system)]."""
        while True:
            try:
                user, system = cpu_seconds(pid)
            except (OSError, IndexError, ValueError):
                return  # it exited
            samples.append([round(time.time(), 3), round(user + system, 3)])
            if self._stop_cpu.wait(CPU_EVERY_S):
                return

    def _stop_sampling(self) -> None:
        self._stop_cpu.set()
        if self._sampler is not None:
            self._sampler.join(timeout=2 * CPU_EVERY_S)
            self._sampler = None

    def _read_status(self, life: dict[str, Any]) -> None:
        """The daemon's daemon-status.json as it is now (written every second; a daemon that
        was killed leaves its last one, which the next overwrites at its first tick)."""
        try:
            status = json.loads((self.state_dir / "daemon-status.json").read_text())
        except (OSError, ValueError) as error:
            life["status"] = None
            life["status_error"] = str(error)
            return
        life["status"] = status
        life["status_is_its_own"] = isinstance(status, dict) and status.get("pid") == life["pid"]

    def _end_life(self, life: dict[str, Any], exit_code: int | str) -> None:
        """What is left to record of a daemon that exited: its code, its log."""
        life["exited"] = time.time()
        life["exit_code"] = exit_code
        self.daemon = self.life = None
        log_path = Path(life["log"])
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        life["marks"] = log_marks(text)
        life["handles_left"] = handles_left(self.state_dir / HANDLES_NAME)
        life["log_tail"] = text.strip().splitlines()[-LOG_TAIL:]
        if self.args.logs_dir is not None:
            kept = self.args.logs_dir / f"daemon-{life['life']}.log"
            with contextlib.suppress(OSError):
                shutil.copyfile(log_path, kept)
                life["log"] = str(kept)
            # What it left for the next daemon to adopt.
            with contextlib.suppress(OSError):
                shutil.copyfile(
                    self.state_dir / "rm-handles.json",
                    self.args.logs_dir / f"rm-handles-{life['life']}.json",
                )

    def kill_daemon(self) -> None:
        """SIGKILL, its status read just before."""
        assert self.daemon is not None and self.life is not None
        life = self.life
        self._read_status(life)
        self._stop_sampling()
        life["killed"] = time.time()
        self.daemon.kill()
        # Bounded: a process inside a driver call dies only when the call returns.
        self._end_life(life, self.daemon.wait(timeout=TERM_WAIT_S))

    def stop_daemon(self, read_status: bool = True) -> None:
        """SIGTERM (a clean shutdown re-opens every channel), SIGKILL if it has not exited in
        TERM_WAIT_S."""
        if self.daemon is None or self.life is None:
            return
        life = self.life
        if read_status:
            self._read_status(life)
        self._stop_sampling()
        life["stopped"] = time.time()
        self.daemon.send_signal(signal.SIGTERM)
        try:
            code: int | str = self.daemon.wait(timeout=TERM_WAIT_S)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            try:
                self.daemon.wait(timeout=TERM_WAIT_S)
                code = "killed after SIGTERM"
            except subprocess.TimeoutExpired:
                code = f"still there {2 * TERM_WAIT_S:g} s after SIGTERM and SIGKILL"
        self._end_life(life, code)

    # -- trainers ----------------------------------------------------------------------------

    def start_trainers(self, start_at: float, seconds: float) -> None:
        env = {
            **os.environ,
            # The bus order, as NVML numbers the GPUs the daemon's index names: CUDA's own
            # default puts the fastest first (the same on a host of one kind of GPU).
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": str(self.args.gpu),
        }
        for name in PODS:
            argv = [
                sys.executable, str(MATMUL), "--n", str(N), "--seconds", f"{seconds:.3f}",
                "--timeline", "--start-at", f"{start_at:.3f}", "--label", name,
            ]  # fmt: skip
            with (
                (self.state_dir / f"trainer-{name}.out").open("wb") as out,
                (self.state_dir / f"trainer-{name}.err").open("wb") as err,
            ):
                self.trainers[name] = subprocess.Popen(
                    in_cgroup(self.cgroups.path(name), argv), env=env, stdout=out, stderr=err,
                    start_new_session=True,
                )  # fmt: skip

    def collect_trainers(self, timeout_s: float) -> None:
        """Each trainer's result line, or the error that stands for it."""
        deadline = time.time() + timeout_s
        for name, proc in self.trainers.items():
            try:
                code = proc.wait(timeout=max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.report["trainers"][name] = {"error": ["timed out", *self._stderr(name)]}
                continue
            self.report["trainers"][name] = self._result(name, code)

    def _stderr(self, name: str) -> list[str]:
        path = self.state_dir / f"trainer-{name}.err"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return text.strip().splitlines()[-5:]

    def _result(self, name: str, code: int) -> dict[str, Any]:
        if code != 0:
            return {"error": [f"exited with {code}", *self._stderr(name)]}
        path = self.state_dir / f"trainer-{name}.out"
        lines = (path.read_text(errors="replace") if path.is_file() else "").strip().splitlines()
        try:
            result = json.loads(lines[-1])
        except (IndexError, ValueError):
            return {"error": ["printed no JSON", *self._stderr(name)]}
        if not isinstance(result, dict):
            return {"error": ["printed no JSON object", *self._stderr(name)]}
        return result

    def kill_trainers(self) -> None:
        """Those still running killed (an error: the run ended early), those that ended and
        were not yet read, read."""
        for name, proc in self.trainers.items():
            if name in self.report["trainers"]:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                self.report["trainers"][name] = {"error": ["killed: the run ended early"]}
            else:
                self.report["trainers"][name] = self._result(name, proc.returncode)

    # -- the run -----------------------------------------------------------------------------

    def sleep_until(self, moment: float) -> None:
        time.sleep(max(moment - time.time(), 0.0))

    def run(self, schedule: list[tuple[str, float]]) -> None:
        args = self.args
        place_doctor_cache(self.state_dir)
        if args.gpu != 0:
            # place_doctor_cache places GPU 0's: the node's cache of this GPU, as production.
            node = doctor_cache_path(default_state_dir(), args.gpu)
            if node.is_file():
                shutil.copyfile(node, doctor_cache_path(self.state_dir, args.gpu))
        state = desired_state({name: self.cgroups.id(name) for name in PODS}, args.gpu)
        store = StateStore(self.state_dir)
        # With --configured-after, the GPU and no pod yet: the trainers' pods come later.
        first_state = desired_state({}, args.gpu) if args.configured_after else state
        store.update(lambda _: first_state)
        first_kind, first_up = schedule[0] if schedule else ("final", args.final_up_s)
        if args.daemon_before:
            # A daemon that ran before the trainers and was stopped: it leaves the mark (a
            # client it made itself), and the trainers start while no daemon runs.
            before = self.start_daemon("before", args.daemon_before)
            self.sleep_until(before["probe_up"] + args.daemon_before)
            self.stop_daemon()
        if args.trainers_first:
            # Processes no daemon ever saw: the first daemon finds their RM objects by asking
            # RM (qpolicy/enforcers/rm/unseen.py). Its start-up is budgeted, not known yet.
            seconds = trainer_seconds(
                schedule, args.down_s, args.final_up_s, args.tail_s, ASSUMED_STARTUP_S,
                args.exit_s,
            ) + TRAINERS_FIRST_LEAD_S + startup_budget(ASSUMED_STARTUP_S)  # fmt: skip
            if args.configured_after:
                # The unconfigured daemon's start-up, life and exit come first.
                seconds += startup_budget(ASSUMED_STARTUP_S) + args.configured_after + args.exit_s
            start_at = time.time() + INIT_S
            self.start_trainers(start_at, seconds)
            self.sleep_until(start_at + TRAINERS_FIRST_LEAD_S)
            if args.clients_between:
                self.report["clients_between"] = age_clients(args.clients_between)
            if args.configured_after:
                # Its first look makes its mark, above the trainers' clients; then the pods.
                unconfigured = self.start_daemon("unconfigured", args.configured_after)
                self.sleep_until(unconfigured["probe_up"] + args.configured_after)
                self.stop_daemon()
                store.update(lambda _: state)
                self.report["configured_at"] = time.time()
            life = self.start_daemon(first_kind, first_up)
        else:
            life = self.start_daemon(first_kind, first_up)
            # The trainers start now, so that the first daemon's probe sees their allocations;
            # they run until after the tail, which the first start-up's duration budgets.
            seconds = trainer_seconds(
                schedule, args.down_s, args.final_up_s, args.tail_s, life["startup_s"],
                args.exit_s,
            )  # fmt: skip
            start_at = time.time() + INIT_S
            self.start_trainers(start_at, seconds)
        end = start_at + seconds
        self.report.update(start_at=start_at, trainer_seconds=round(seconds, 3), planned_end=end)
        print(
            f"life 0: probe up in {life['startup_s']:.1f} s; trainers start "
            f"{'before it' if args.trainers_first else f'in {INIT_S:g} s'}, for {seconds:.0f} s",
            flush=True,
        )
        slowest = life["startup_s"]
        # The first daemon's time counts from the trainers' start where they started after it.
        first_from = None if args.trainers_first else start_at
        for number, (kind, up_s) in enumerate(schedule):
            if number > 0:
                # Enough left for this life, its down time, and the final daemon and tail?
                budget = startup_budget(slowest)
                down = max(args.down_s, args.exit_s)
                needed = budget + up_s + down + budget + args.final_up_s + args.exit_s
                if time.time() + needed + args.tail_s > end:
                    self.report["cut_short"] = (
                        f"after {number} of {len(schedule)} kills: start-ups took up to "
                        f"{slowest:.1f} s, more than the trainers' time allowed"
                    )
                    print(self.report["cut_short"], flush=True)
                    break
                life = self.start_daemon(kind, up_s)
                slowest = max(slowest, life["startup_s"])
            # The first daemon's time counts from the trainers' start, the others' from their
            # probe: a short one is killed in its first turns.
            planned = (first_from if number == 0 and first_from else life["probe_up"]) + up_s
            self.sleep_until(planned)
            # A life that had to search for its processes governs from the find: kept up for
            # its planned time from there.
            self._read_status(life)
            moment = kill_at(life, up_s, planned)
            if moment > planned:
                life["kept_up_for_search_s"] = round(moment - planned, 3)
                self.sleep_until(moment)
            self.kill_daemon()
            print(
                f"life {life['life']}: probe up in {life['startup_s']:.1f} s, up {up_s:.2f} s "
                f"({kind}), killed; marks: {len(life['marks'])}",
                flush=True,
            )
            self.sleep_until(life["killed"] + args.down_s)
        if schedule:
            life = self.start_daemon("final", args.final_up_s)
        up_from = first_from if life["life"] == 0 and first_from else life["probe_up"]
        # Whatever the restarts took, the tail keeps its time (the trainers' end is fixed).
        final_up = min(args.final_up_s, end - args.tail_s - args.exit_s - up_from)
        life["planned_up_s"] = round(max(final_up, 0.0), 3)
        self.sleep_until(up_from + final_up)
        self.stop_daemon()
        print(
            f"life {life['life']}: final, up {final_up:.2f} s, stopped (exit "
            f"{life['exit_code']}); tail of {end - time.time():.1f} s",
            flush=True,
        )
        self.collect_trainers(max(end - time.time(), 0.0) + COLLECT_S)

    def stop(self) -> None:
        """Leave nothing running: the daemon (SIGTERM, then SIGKILL), the trainers, the
        cgroups."""
        try:
            self.stop_daemon(read_status=False)
        finally:
            try:
                self.kill_trainers()
            finally:
                self.cgroups.clean()


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("daemon-restart.json"))
    parser.add_argument("--kills", type=int, default=6, help="daemons killed with SIGKILL")
    parser.add_argument(
        "--up-s",
        type=float,
        nargs=2,
        default=[3.0, 6.0],
        metavar=("MIN", "MAX"),
        help="a long life's time up (every other life; the rest 0.05-0.5 s after probe up)",
    )
    parser.add_argument("--down-s", type=float, default=1.0, help="time with no daemon per kill")
    parser.add_argument(
        "--exit-s",
        type=float,
        default=EXIT_S,
        help="what a daemon is expected to take to exit once killed or stopped (budgeted)",
    )
    parser.add_argument("--final-up-s", type=float, default=6.0)
    parser.add_argument("--tail-s", type=float, default=4.0, help="time after the final SIGTERM")
    parser.add_argument(
        "--settle-s", type=float, default=1.0, help="a window starts this long after probe up"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--trainers-first",
        action="store_true",
        help="start the trainers before the first daemon: processes no daemon ever saw",
    )
    parser.add_argument(
        "--daemon-before",
        type=float,
        default=0.0,
        metavar="S",
        help="with --trainers-first: a daemon runs S s and is stopped before the trainers start "
        "(they start while no daemon runs, as during a restart)",
    )
    parser.add_argument(
        "--clients-between",
        type=int,
        default=0,
        metavar="N",
        help="with --trainers-first: N RM clients made and freed after the trainers start, as "
        "nvidia-smi or DCGM make them, so that the trainers' clients are that much older",
    )
    parser.add_argument(
        "--configured-after",
        type=float,
        default=0.0,
        metavar="S",
        help="with --trainers-first: a daemon runs S s with the trainers' pods not configured "
        "and is stopped; its mark lies above their clients, and the pods are configured then "
        "(the next daemon must search below the mark)",
    )
    parser.add_argument(
        "--qpolicy-root",
        type=Path,
        default=ROOT,
        help="the checkout whose package the daemon runs (default: this repository)",
    )
    parser.add_argument(
        "--daemon-logs", action="store_true", help="daemons at debug level (else info)"
    )
    parser.add_argument("--logs-dir", type=Path, default=None, help="keep each daemon's log here")
    parser.add_argument(
        "--table", metavar="JSON", help="print the table of an earlier run's JSON and exit"
    )
    args = parser.parse_args(argv)
    if args.table:
        path = Path(args.table)
        if path.suffix == ".xz":
            with lzma.open(path, "rt") as compressed:
                text = compressed.read()
        else:
            text = path.read_text()
        print("\n".join(table(analyse(json.loads(text)))))
        return 0
    if (args.configured_after or args.daemon_before) and not args.trainers_first:
        parser.error("--configured-after and --daemon-before need --trainers-first")
    if args.configured_after < 0 or args.daemon_before < 0:
        parser.error("--configured-after and --daemon-before take 0 seconds or more")
    if args.kills < 0 or args.up_s[0] > args.up_s[1] or min(args.up_s) < 0:
        parser.error("--kills must be 0 or more, and --up-s MIN MAX with 0 <= MIN <= MAX")
    args.qpolicy_root = args.qpolicy_root.resolve()
    if not (args.qpolicy_root / "qpolicy" / "__main__.py").is_file():
        parser.error(f"--qpolicy-root {args.qpolicy_root}: no qpolicy package there")
    if args.logs_dir is not None:
        args.logs_dir.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    schedule = up_times(args.kills, args.seed, (args.up_s[0], args.up_s[1]))
    estimate = estimate_s(schedule, args.down_s, args.final_up_s, args.tail_s, exit_s=args.exit_s)
    print(
        f"{args.kills} kills; about {estimate / 60:.1f} min at {ASSUMED_STARTUP_S:g} s a daemon "
        "start",
        flush=True,
    )
    report: dict[str, Any] = {
        **host_facts(),
        "gpu": _gpu_name(args.gpu),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "qpolicy_commit": _commit(args.qpolicy_root),
        "schedule": schedule,
        "estimate_s": round(estimate, 1),
        "lives": [],
        "trainers": {},
        "errors": [],
    }
    code = 0
    # A SIGTERM to this tool unwinds as Ctrl-C does, through the cleanup below.
    signal.signal(signal.SIGTERM, _interrupted)
    with tempfile.TemporaryDirectory(
        prefix="qpolicy-restart-state-", ignore_cleanup_errors=True
    ) as directory:
        run: Run | None = None
        try:
            run = Run(args, Path(directory), report)
            run.run(schedule)
        except KeyboardInterrupt as error:
            report["errors"].append(f"interrupted ({str(error) or 'Ctrl-C'})")
            code = 130
        except Exception as error:
            report["errors"].append(f"{type(error).__name__}: {error}")
            code = 1
        finally:
            # Nothing interrupts the cleanup: a daemon or trainer left running would hold the GPU
            # (and a killed daemon's pods closed).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                if run is not None:
                    run.stop()
            except Exception as error:
                report["errors"].append(f"cleanup: {type(error).__name__}: {error}")
                code = code or 1
            analyse(report)
            args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("\n".join(table(report)))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
