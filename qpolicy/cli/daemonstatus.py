"""``qpolicy status``'s section on the running daemon: what it sees and does, when one runs.

The daemon writes ``daemon-status.json`` into the state directory every second and holds the
node's lock while it runs (:mod:`qpolicy.instance`); a file without a lock holder is a leftover
and is not shown.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from qpolicy.cli.output import console, print_own_timeslices
from qpolicy.instance import STATUS_NAME, running_daemon

# Older than this, the daemon is stuck: say so rather than show it as current.
STALE_S = 10.0


def report(state_dir: Path) -> dict[str, Any] | None:
    """The running daemon's last view, or None when no daemon runs here."""
    pid = running_daemon(state_dir)
    if pid is None:
        return None
    try:
        document: dict[str, Any] = json.loads((state_dir / STATUS_NAME).read_text())
    except (OSError, ValueError):
        return {"pid": pid, "error": "the daemon has not published its view yet"}
    if not isinstance(document, dict):
        return {"pid": pid, "error": f"{state_dir / STATUS_NAME} is not a JSON object"}
    written = document.get("written")
    if isinstance(written, int | float):
        document["age_s"] = round(max(time.time() - written, 0.0), 1)
    return document


def render(doc: dict[str, Any]) -> None:
    pid = doc.get("pid")
    if "error" in doc:
        console.print(f"daemon (pid {pid}): {escape(str(doc['error']))}", soft_wrap=True)
        return
    sources = ", ".join(f"{k} {'up' if v else 'DOWN'}" for k, v in doc.get("sources", {}).items())
    age = doc.get("age_s")
    stale = f" [red]view {age:.0f} s old[/red]" if isinstance(age, float) and age > STALE_S else ""
    console.print(
        f"daemon pid {pid} · enforcer [b]{escape(str(doc.get('enforcer')))}[/b] · {sources}{stale}",
        soft_wrap=True,
    )
    annotations = doc.get("annotations")
    if isinstance(annotations, dict) and annotations.get("walked"):
        # The walk's cost grows with the cgroups on the node (qpolicy.desired.annotationwatch):
        # it is spaced to a share of a core, so a big tree is walked less often.
        every = annotations.get("walk_every_s")
        cost = annotations.get("walk_ms")
        often = f"every {every:g} s" if isinstance(every, (int, float)) else "every second"
        took = f", {cost:g} ms a walk" if isinstance(cost, (int, float)) else ""
        console.print(
            f"[yellow]annotations: the cgroup hierarchy is walked {often}[/yellow]{took} ("
            f"{escape(str(annotations['walked']))})",
            soft_wrap=True,
        )
    ids = doc.get("cgroup_ids")
    if isinstance(ids, dict) and ids.get("by_id") is False and ids.get("walks"):
        # Each cgroup id the probe reports that is not known yet walks the hierarchy
        # (qpolicy.telemetry.cgroups): a tenant's many cgroups make each walk long.
        console.print(
            f"[yellow]cgroup ids are found by walking the hierarchy[/yellow] ({ids['walks']} "
            f"walks, {ids.get('walk_ms')} ms the last, at most every {ids.get('walk_every_s')} "
            "s): opening cgroups by id needs CAP_DAC_READ_SEARCH and Linux 5.5",
            soft_wrap=True,
        )
    pods = doc.get("pods", [])
    if pods:
        table = Table("pod", "GPU", "class", "GPU time", "throttled", "planned", "closed",
                      "processes", title="what the daemon sees")  # fmt: skip
        table.columns[0].overflow = "fold"
        for pod in pods:
            planned = pod.get("planned_share")
            name = str(pod.get("id"))
            if pod.get("name"):  # a Kubernetes pod: as kubectl names it, then its cgroup
                name = f"{pod.get('namespace')}/{pod['name']} ({name})"
            table.add_row(
                escape(name),
                str(pod.get("gpu")),
                str(pod.get("class")),
                f"{pod.get('gpu_time_s', 0):.1f} s",
                f"{pod.get('throttled_s', 0):.1f} s",
                "-" if planned is None else f"{planned * 100:.1f} %",
                "closed" if pod.get("closed") else "",
                str(pod.get("processes", 0)),
            )
        console.print(table)
    for refused in doc.get("refused", []):
        console.print(
            f"[red]refused[/red] ({escape(str(refused.get('source')))}, "
            f"{escape(str(refused.get('reason')))}): {escape(str(refused.get('message')))}",
            soft_wrap=True,
        )
    found = doc.get("backend")
    backend: dict[str, Any] = found if isinstance(found, dict) else {}
    print_restart(backend)
    print_guard(backend)
    print_unseen(backend)
    gpus = backend.get("gpus", {})
    for gpu, view in sorted(gpus.items()) if isinstance(gpus, dict) else ():
        own = view.get("own_timeslices") if isinstance(view, dict) else None
        for pod, contexts in sorted(own.items()) if isinstance(own, dict) else ():
            # The rm enforcer's rule (enforcers/rm/control.py): said here because it changes
            # what the online class gives next to this pod.
            print_own_timeslices(
                f"GPU {escape(str(gpu))}: pod {escape(str(pod))} has "
                f"{escape(str(contexts))} CUDA contexts here"
            )
        print_period(gpu, view)
        print_promise(gpu, view)
        modes = view.get("preemption_modes") if isinstance(view, dict) else None
        if isinstance(modes, dict) and modes:
            # The doctor's CTA strategy (enforcers/rm/preemption.py): it changes how offline
            # work gives the GPU up to online work.
            pods = ", ".join(f"{p} ({m})" for p, m in sorted(modes.items()))
            console.print(
                f"GPU {escape(str(gpu))}: compute preemption set on offline pods' contexts: "
                f"{escape(pods)}",
                soft_wrap=True,
            )
    lost = doc.get("probe_lost_events")
    if lost:
        console.print(f"[yellow]the probe lost {lost} events[/yellow]", soft_wrap=True)


def print_period(gpu: object, view: object) -> None:
    """A period the rm enforcer stretched: fixed shares hold over its turns (and the rotation of
    their order), not over the configured period, and a pod may wait most of it for its turn;
    or a quiet one, where nothing is gated and the loop only keeps demand and metrics."""
    if not isinstance(view, dict):
        return
    period, configured = view.get("period_us"), view.get("configured_period_us")
    if not isinstance(period, int | float) or not isinstance(configured, int | float):
        return
    if period <= configured:
        return
    why = (
        ": nothing to gate (one offline pod at most, no online cap), so the loop steps once a "
        "second"
        if view.get("stretched_for") == "quiet"
        else " so that each offline pod's turn lasts the daemon's --min-turn-ms"
    )
    console.print(
        f"GPU {escape(str(gpu))}: period stretched to {period / 1000:g} ms (configured "
        f"{configured / 1000:g} ms){why}",
        soft_wrap=True,
    )


def print_promise(gpu: object, view: object) -> None:
    """What the doctor's result for the GPU says qpolicy can promise online work there, target
    by target (enforcers/strategy.py carries it from the cache)."""
    strategy = view.get("online_strategy") if isinstance(view, dict) else None
    if not isinstance(strategy, dict):
        return
    promise = strategy.get("promise")
    if not isinstance(promise, list) or not promise:
        return
    console.print(
        f"GPU {escape(str(gpu))}: what qpolicy can promise online work here "
        f"({escape(str(strategy.get('source')))}):",
        soft_wrap=True,
    )
    for line in promise:
        console.print(f"  {escape(str(line))}", soft_wrap=True)


def print_unseen(backend: dict[str, Any]) -> None:
    """The pods' processes the rm enforcer found by asking RM (their allocations were never
    seen), those it is still asking about, and those it cannot govern."""
    searched = backend.get("searched")
    if isinstance(searched, dict):
        if searched.get("found_processes"):
            console.print(
                f"found by asking RM: {searched['found_processes']} process(es) "
                f"({searched.get('found_channels', 0)} channels) no probe saw allocate",
                soft_wrap=True,
            )
        searching = searched.get("searching")
        if isinstance(searching, list) and searching:
            pids = ", ".join(escape(str(pid)) for pid in searching)
            console.print(f"asking RM for the objects of pid(s) {pids}", soft_wrap=True)
        look = searched.get("look")
        if isinstance(look, dict) and look.get("spaced"):
            # The pods' cgroups are their tenants' to make; looks are kept to a share of a core.
            console.print(
                f"[yellow]processes no probe saw are looked for every {look.get('every_s')} s"
                f"[/yellow]: the pods' {look.get('cgroups')} cgroups took {look.get('ms')} ms "
                "a look",
                soft_wrap=True,
            )
        refusals = searched.get("refusals")
        if isinstance(refusals, int) and refusals:
            # Only where client handles could not be checked first (rmctl.ClientCheck).
            console.print(
                f"[yellow]{refusals} question(s)[/yellow] about client handles RM could not "
                "name: each that does not exist wrote a kernel log line",
                soft_wrap=True,
            )
    unseen = backend.get("unseen_processes")
    for pod, pids in sorted(unseen.items()) if isinstance(unseen, dict) else ():
        listed = ", ".join(escape(str(pid)) for pid in pids) if isinstance(pids, list) else ""
        console.print(
            f"[yellow]not governed[/yellow]: pod {escape(str(pod))}: pid(s) {listed} use the "
            "GPU with channels the enforcer does not know (yet)",
            soft_wrap=True,
        )


def print_guard(backend: dict[str, Any]) -> None:
    """Said only when something is wrong with the rm enforcer's guard (enforcers/rm/guard.py),
    the process that reopens what the daemon closed if the daemon is killed."""
    if "guard" not in backend:
        return  # not the rm enforcer
    guard = backend["guard"]
    if not isinstance(guard, dict):
        console.print(
            "[yellow]no guard[/yellow]: it could not be started; a pod closed when the daemon "
            "is killed stays closed until the next daemon starts",
            soft_wrap=True,
        )
        return
    if not guard.get("running"):
        console.print(
            "[yellow]the guard is not running[/yellow] (started again within 10 s)",
            soft_wrap=True,
        )
    restarts = guard.get("restarts")
    if isinstance(restarts, int) and restarts:
        console.print(f"the guard was started again {restarts} time(s)", soft_wrap=True)


def print_restart(backend: dict[str, Any]) -> None:
    """What the rm enforcer took over from the daemon before it, where it took anything: the
    channel groups it re-opened and timeslices it restored (a killed daemon's), the processes it
    adopted, and what it could not do of either."""
    recovered = backend.get("recovered")
    adopted = backend.get("adopted")
    parts = []
    if isinstance(recovered, dict) and (
        recovered.get("channel_groups_opened")
        or recovered.get("timeslices_restored")
        or recovered.get("preemption_modes_restored")
    ):
        modes = recovered.get("preemption_modes_restored")
        parts.append(
            f"re-opened {recovered.get('channel_groups_opened', 0)} channel group(s) and "
            f"restored {recovered.get('timeslices_restored', 0)} timeslice(s)"
            + (f" and {modes} preemption mode(s)" if modes else "")
        )
    if isinstance(adopted, dict) and adopted.get("processes"):
        parts.append(
            f"adopted {adopted['processes']} process(es) ({adopted.get('channels', 0)} channels)"
        )
    if parts:
        console.print(
            f"at start: {escape('; '.join(parts))} the daemon before it left", soft_wrap=True
        )
    for kind, found in (("undo", recovered), ("adopt", adopted)):
        problems = found.get("problems") if isinstance(found, dict) else None
        for problem in problems if isinstance(problems, list) else ():
            console.print(
                f"[yellow]could not {kind} at start[/yellow]: {escape(str(problem))}",
                soft_wrap=True,
            )
