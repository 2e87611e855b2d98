"""``qpolicy pod set|rm|delete|ls``: the pods on the GPUs, their class, share and memory."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from qpolicy.cli.output import JsonOption, console, err_console, percent, print_json, state_store
from qpolicy.model import (
    PodClass,
    PodIdKind,
    PodSpec,
    format_bytes,
    parse_memory,
    parse_pod_id,
    parse_share,
    pod_id_kind,
)
from qpolicy.state import DesiredState
from qpolicy.telemetry.gpus import parse_gpu

pod_app = typer.Typer(
    help="Manage pods: which GPU they use, their class, share and memory limit.",
    no_args_is_help=True,
)

PodId = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="cgroup v2 path (*/kubepods.slice/...*), Kubernetes pod (*ml/trainer-0*) or a "
        "simulated pod's name.",
        show_default=False,
    ),
]
NONE = "none"

_NOTES = {
    PodIdKind.KUBERNETES: "names a Kubernetes pod: the rm and kmod enforcers govern pods by their "
    "cgroup path, so the daemon refuses it (say so with qpolicy.io/* annotations on the pod, read "
    "by `qpolicy daemon --kubernetes`, or name its cgroup)",
    PodIdKind.NAME: "is a name, not a cgroup path: only the simulated node enforces it; the rm and "
    "kmod enforcers govern pods by their cgroup path (/kubepods.slice/...)",
}


def _optional(text: str | None, parse: Any) -> Any:
    """None: not given (keep); NONE: clear; else the parsed value."""
    if text is None:
        return ...
    if text.strip().lower() == NONE:
        return None
    return parse(text)


@pod_app.command("set")
def set_pod(
    pod_id: PodId,
    *,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            metavar="N|UUID",
            help="GPU index (as nvidia-smi numbers them) or UUID (GPU-...). A new pod defaults to "
            "GPU 0.",
            show_default=False,
        ),
    ] = None,
    pod_class: Annotated[
        str | None,
        typer.Option(
            "--class",
            metavar="CLASS",
            help="**online** (latency-critical, served first) or **offline** (batch; the default "
            "of a new pod).",
            show_default=False,
        ),
    ] = None,
    share: Annotated[
        str | None,
        typer.Option(
            "--share",
            metavar="PERCENT",
            help="Share of the GPU's time, 1 to 100 (required on fixed-share and burst-share "
            "GPUs); *none* removes it.",
            show_default=False,
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            metavar="SIZE",
            help="Device memory limit, a Kubernetes quantity (*8Gi*, *8G*, *512Mi*, *1e9*) or "
            "*8GiB*; *none* removes it.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Add a pod, or change the options given of an existing one (a patch, as `kubectl set`
    does: options not given keep their values)."""
    pod_id = parse_pod_id(pod_id)
    new_gpu = None if gpu is None else parse_gpu(gpu)
    new_class = None if pod_class is None else PodClass.parse(pod_class)
    new_share = _optional(share, parse_share)
    new_memory = _optional(memory, parse_memory)
    before: PodSpec | None = None

    def change(state: DesiredState) -> DesiredState:
        # Decided under the store's lock, so it patches the state this command replaces.
        nonlocal before
        before = state.pods.get(pod_id)
        base = before or PodSpec(pod_id, 0)
        pod = PodSpec(
            id=pod_id,
            gpu=base.gpu if new_gpu is None else new_gpu,
            pod_class=base.pod_class if new_class is None else new_class,
            share=base.share if new_share is ... else new_share,
            memory_limit=base.memory_limit if new_memory is ... else new_memory,
        )
        return state.with_pod(pod)

    pod = state_store().update(change).pods[pod_id]
    action = "added" if before is None else "unchanged" if before == pod else "updated"
    note = _NOTES.get(pod_id_kind(pod_id))
    if as_json:
        print_json({"action": action, "pod": pod_json(pod), "note": note})
        return
    memory_text = format_bytes(pod.memory_limit) if pod.memory_limit is not None else "no limit"
    console.print(
        f"{action} pod [b]{escape(pod.id)}[/b] on GPU {pod.gpu}: "
        f"{pod.pod_class.value}, share {percent(pod.share)}, memory {memory_text}",
        soft_wrap=True,
    )
    if note is not None:
        err_console.print(f"qpolicy: note: {pod_id} {note}", markup=False, soft_wrap=True)


def remove_pod(pod_id: PodId, *, as_json: JsonOption = False) -> None:
    """Remove a pod (also: `pod delete`)."""
    # Not parsed: an ID the parser would refuse cannot be in the state, and "no pod" says so.
    state_store().update(lambda state: state.without_pod(pod_id))
    if as_json:
        print_json({"action": "removed", "pod": pod_id})
        return
    console.print(f"removed pod [b]{escape(pod_id)}[/b]", soft_wrap=True)


pod_app.command("rm")(remove_pod)
pod_app.command("delete", help="Remove a pod (an alias of `pod rm`).")(remove_pod)


@pod_app.command("ls")
def list_pods(*, as_json: JsonOption = False) -> None:
    """List the pods, by GPU and ID."""
    store = state_store()
    pods = sorted(store.load().pods.values(), key=lambda p: (p.gpu, p.id))
    if as_json:
        print_json([pod_json(pod) for pod in pods])
        return
    if not pods:
        console.print(
            f"No pods in {escape(str(store.path))}. "
            "Add one with: qpolicy pod set ID --gpu N --share PERCENT",
            soft_wrap=True,
        )
        return
    table = Table("ID", "GPU", "class", "share", "memory")
    # Pod IDs are long cgroup paths: fold them rather than hide their end behind an ellipsis.
    table.columns[0].overflow = "fold"
    for pod in pods:
        table.add_row(
            escape(pod.id),
            str(pod.gpu),
            pod.pod_class.value,
            percent(pod.share),
            format_bytes(pod.memory_limit) if pod.memory_limit is not None else "-",
        )
    console.print(table)


def pod_json(pod: PodSpec) -> dict[str, Any]:
    return {
        "id": pod.id,
        "gpu": pod.gpu,
        "class": pod.pod_class.value,
        "share": pod.share,
        "memory_bytes": pod.memory_limit,
    }
