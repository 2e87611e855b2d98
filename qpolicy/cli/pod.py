"""``qpolicy pod set|rm|ls``: the pods on the node's GPUs and their class, share and memory."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from qpolicy.cli.output import console, percent, print_json, state_store
from qpolicy.model import (
    PodClass,
    PodSpec,
    format_bytes,
    parse_gpu_index,
    parse_memory,
    parse_pod_id,
    parse_share,
)
from qpolicy.state import DesiredState

pod_app = typer.Typer(
    help="Manage pods: which GPU they use, their class, share and memory limit.",
    no_args_is_help=True,
)

PodId = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="cgroup v2 path (*/kubepods.slice/...*) or pod name (*ml/trainer-0*).",
        show_default=False,
    ),
]


@pod_app.command("set")
def set_pod(
    pod_id: PodId,
    *,
    gpu: Annotated[
        str,
        typer.Option("--gpu", metavar="N", help="GPU index the pod runs on."),
    ],
    pod_class: Annotated[
        str,
        typer.Option(
            "--class",
            metavar="CLASS",
            help="**online** (latency-critical, served first) or **offline** (batch).",
        ),
    ] = PodClass.OFFLINE.value,
    share: Annotated[
        str | None,
        typer.Option(
            "--share",
            metavar="PERCENT",
            help="Share of the GPU's time, 1 to 100; required on fixed-share and burst-share GPUs.",
            show_default=False,
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            metavar="SIZE",
            help="Device memory limit: *8GiB*, *512MiB*, *8Gi*, *16GB* or bytes.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Add a pod, or replace the pod of that ID (options not given take their defaults)."""
    pod = PodSpec(
        id=parse_pod_id(pod_id),
        gpu=parse_gpu_index(gpu),
        pod_class=PodClass.parse(pod_class),
        share=parse_share(share) if share is not None else None,
        memory_limit=parse_memory(memory) if memory is not None else None,
    )
    replaced = False

    def change(state: DesiredState) -> DesiredState:
        # Decided under the store's lock, so it describes the state this command replaced.
        nonlocal replaced
        replaced = pod.id in state.pods
        return state.with_pod(pod)

    state_store().update(change)
    memory_text = format_bytes(pod.memory_limit) if pod.memory_limit is not None else "no limit"
    console.print(
        f"{'replaced' if replaced else 'added'} pod [b]{escape(pod.id)}[/b] on GPU {pod.gpu}: "
        f"{pod.pod_class.value}, share {percent(pod.share)}, memory {memory_text}",
        soft_wrap=True,
    )


@pod_app.command("rm")
def remove_pod(pod_id: PodId) -> None:
    """Remove a pod."""
    # Not parsed: an ID the parser would refuse cannot be in the state, and "no pod" says so.
    state_store().update(lambda state: state.without_pod(pod_id))
    console.print(f"removed pod [b]{escape(pod_id)}[/b]", soft_wrap=True)


@pod_app.command("ls")
def list_pods(
    *,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
) -> None:
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
