"""``qpolicy status``: the desired state per GPU and what each pod would get when all are busy,
and qgpu.ko's own view where the module is loaded."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from qpolicy import engine
from qpolicy.cli import daemonstatus, kmodstatus
from qpolicy.cli.output import JsonOption, console, percent, print_json, state_store
from qpolicy.errors import PlanError
from qpolicy.model import format_bytes
from qpolicy.state import DesiredState


def status(*, as_json: JsonOption = False) -> None:
    """Show each GPU's policy and pods, and the share each pod gets when every pod is busy.

    When a daemon runs, also what it sees: each pod's GPU and throttled time, whether it is
    closed now, and the pods it refused and why. Where qgpu.ko is loaded, also what the module
    reports: each configured cgroup's memory used against its limit and its GPU and throttled
    time (the counters need CAP_NET_ADMIN).
    """
    store = state_store()
    state = store.load()
    gpus = [gpu_report(state, index) for index in state.gpu_indices()]
    daemon = daemonstatus.report(store.directory)
    kmod = kmodstatus.report()
    if as_json:
        document: dict[str, Any] = {"state_file": str(store.path), "gpus": gpus}
        document["daemon"] = daemon
        if kmod is not None:
            document["kmod"] = kmod
        print_json(document)
        return
    if not gpus:
        console.print(
            f"Nothing configured yet ({escape(str(store.path))} is empty or absent). Start with:\n"
            "  qpolicy set --gpu 0 --policy burst-share\n"
            "  qpolicy pod set ml/trainer-0 --gpu 0 --share 30",
            soft_wrap=True,
        )
    else:
        for gpu in gpus:
            render_gpu(gpu)
        console.print(f"[dim]state file: {escape(str(store.path))}[/dim]", soft_wrap=True)
    if daemon is not None:
        daemonstatus.render(daemon)
    if kmod is not None:
        kmodstatus.render(kmod)


def gpu_report(state: DesiredState, index: int) -> dict[str, Any]:
    """The JSON object of one GPU; the table is drawn from it too, so both always agree."""
    gpu = state.gpu(index)
    pods = state.pods_on(index)
    planned: dict[str, float] = {}
    error = None
    try:
        # All pods saturating: the allocation is then exactly what the policy guarantees.
        plan = engine.plan(gpu, pods, {pod.id: 1.0 for pod in pods})
        planned = {s.pod: round(s.allocation, 6) for s in plan.slices}
    except PlanError as failure:
        # A hand-edited or older state file may not plan; show it rather than fail the command.
        error = str(failure)
    return {
        "index": index,
        "policy": gpu.policy.value,
        "period_ms": gpu.period_ms,
        "shares_sum": sum(pod.share or 0 for pod in pods),
        "error": error,
        "pods": [
            {
                "id": pod.id,
                "class": pod.pod_class.value,
                "share": pod.share,
                "memory_bytes": pod.memory_limit,
                "planned_share_when_busy": planned.get(pod.id),
            }
            for pod in pods
        ],
    }


def render_gpu(gpu: dict[str, Any]) -> None:
    title = (
        f"GPU {gpu['index']} · [b]{gpu['policy']}[/b] · period {gpu['period_ms']} ms"
        f" · shares {gpu['shares_sum']} %"
    )
    if not gpu["pods"]:
        console.print(f"{title}: no pods", soft_wrap=True)
        return
    table = Table("pod", "class", "share", "memory", "when all busy", title=title)
    table.columns[0].overflow = "fold"
    for pod in gpu["pods"]:
        planned = pod["planned_share_when_busy"]
        table.add_row(
            escape(pod["id"]),
            pod["class"],
            percent(pod["share"]),
            format_bytes(pod["memory_bytes"]) if pod["memory_bytes"] is not None else "-",
            "-" if planned is None else f"{planned * 100:.1f} %",
        )
    console.print(table)
    if gpu["error"] is not None:
        console.print(f"[red]cannot plan GPU {gpu['index']}:[/red] {escape(gpu['error'])}")
