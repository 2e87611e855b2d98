"""``qpolicy trace``: NVIDIA driver traffic per process and cgroup, recorded or live."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from qpolicy.cli.output import console, print_json
from qpolicy.errors import ValidationError
from qpolicy.model import format_bytes
from qpolicy.nvrm.replay import BUILTIN_TRACE, ReplayResult, replay
from qpolicy.nvrm.tracker import Summary

TOP_CONTROLS = 15


def trace(
    *,
    replay_file: Annotated[
        str | None,
        typer.Option(
            "--replay",
            metavar="TRACE.jsonl",
            help=f"Replay a recorded trace (JSON lines, .gz too; '{BUILTIN_TRACE}' is shipped).",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of tables.")
    ] = False,
) -> None:
    """Show which GPU objects each process holds and what it asks the NVIDIA driver.

    With **--replay**, a recorded trace goes through the same decoder and object tracker the live
    probe feeds: per process its clients, TSGs, channels, engine objects, device memory live at
    the end and at its peak, ioctl counts by escape and by control command, and the slowest calls.
    """
    if replay_file is None:
        raise ValidationError("live tracing needs the eBPF probe; use --replay TRACE.jsonl for now")
    result = replay(replay_file)
    if json_output:
        print_json(result.to_json())
        return
    print_replay(result)


def print_replay(result: ReplayResult) -> None:
    console.print(
        f"{result.source}: {result.records} records, {result.malformed} malformed line(s)",
        markup=False,
        highlight=False,
    )
    for bad in result.malformed_examples[:5]:
        console.print(f"  line {bad.line}: {bad.reason}", markup=False, highlight=False)
    for summary in result.processes:
        console.print(_objects_table(summary))
        console.print(_counts_table("ioctls by escape", summary.escapes, None))
        console.print(_counts_table("RM controls", summary.controls, TOP_CONTROLS))
        console.print(_slowest_table(summary))


def _who(summary: Summary) -> str:
    if summary.pid is None:
        return "the traced process"
    cgroup = "" if summary.cgroup is None else f", cgroup {summary.cgroup}"
    return f"pid {summary.pid}{cgroup}"


def _objects_table(summary: Summary) -> Table:
    table = Table(title=f"{_who(summary)}: objects", title_justify="left")
    table.add_column("what")
    table.add_column("now", justify="right")
    table.add_column("created", justify="right")
    created = summary.created
    table.add_row("clients", str(summary.clients), str(created.get("client", 0)))
    table.add_row("TSGs", str(summary.tsgs), str(created.get("tsg", 0)))
    for name, count in sorted(summary.channels.items()):
        table.add_row(f"channels {name}", str(count), "")
    table.add_row("channels", str(summary.channel_count), str(created.get("channel", 0)))
    for name, count in sorted(summary.engines.items()):
        table.add_row(f"engine {name}", str(count), "")
    table.add_row(
        "device memory",
        format_bytes(summary.device_bytes),
        f"peak {format_bytes(summary.device_peak)}",
    )
    table.add_row(
        "system memory",
        format_bytes(summary.system_bytes),
        f"peak {format_bytes(summary.system_peak)}",
    )
    table.add_row("ioctls on NVIDIA files", str(summary.ioctls), f"{summary.failed} failed")
    table.add_row("ioctls on other files", str(summary.other_ioctls), "")
    table.add_row("mmaps of NVIDIA files", str(summary.mmaps), "")
    return table


def _counts_table(title: str, counts: dict[str, int], top: int | None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("name")
    table.add_column("count", justify="right")
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = ordered if top is None else ordered[:top]
    for name, count in shown:
        table.add_row(name, str(count))
    rest = ordered[len(shown) :]
    if rest:
        table.add_row(f"({len(rest)} more)", str(sum(count for _, count in rest)))
    return table


def _slowest_table(summary: Summary) -> Table:
    table = Table(title="slowest ioctls", title_justify="left")
    table.add_column("call")
    table.add_column("ms", justify="right")
    for slow in summary.slowest:
        table.add_row(slow.name, f"{slow.dur_ns / 1e6:.3f}")
    return table
