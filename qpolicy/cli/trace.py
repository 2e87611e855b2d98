"""``qpolicy trace``: NVIDIA driver traffic per process and cgroup, recorded or live."""

from __future__ import annotations

import json
import signal
import sys
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from qpolicy.cli.output import console, err_console, print_json
from qpolicy.errors import ValidationError
from qpolicy.model import format_bytes
from qpolicy.nvrm.replay import BUILTIN_TRACE, ReplayResult, replay
from qpolicy.nvrm.tracker import Summary
from qpolicy.telemetry import live
from qpolicy.telemetry.cgroups import CgroupMap, normalize
from qpolicy.telemetry.devices import DeviceFilter
from qpolicy.telemetry.probe import NvProbe

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
        bool,
        typer.Option("--json", help="Print JSON instead of tables (live: one object per line)."),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, metavar="S", help="Live: seconds per row.")
    ] = 1.0,
    duration: Annotated[
        float | None,
        typer.Option("--duration", min=0.0, metavar="S", help="Live: stop after S seconds."),
    ] = None,
    cgroup: Annotated[
        str | None,
        typer.Option(
            "--cgroup",
            metavar="PATH",
            help="Live: only this cgroup v2 path (e.g. /kubepods.slice) and its descendants.",
        ),
    ] = None,
    ebpf: Annotated[
        bool, typer.Option("--ebpf", help="Print the BPF C program the probe would load, and exit.")
    ] = False,
    devices: Annotated[
        list[str] | None,
        typer.Option("--device", hidden=True, help="Test only: MAJOR:MINOR=NODE to watch."),
    ] = None,
    libcuda: Annotated[
        str, typer.Option("--libcuda", hidden=True, help="Test only: libcuda to probe.")
    ] = "auto",
) -> None:
    """Show which GPU objects each process holds and what it asks the NVIDIA driver.

    Live (needs root): the eBPF probe watches the NVIDIA device files and libcuda's launch calls;
    every **--interval** a row per cgroup shows its ioctl and launch rates and the TSGs, channels
    and device memory its processes hold. Ctrl-C stops after a last row (exit status 0).

    With **--replay**, a recorded trace goes through the same decoder and object tracker the live
    probe feeds: per process its clients, TSGs, channels, engine objects, device memory live at
    the end and at its peak, ioctl counts by escape and by control command, and the slowest calls.

    Examples: `qpolicy trace` · `qpolicy trace --json --cgroup /kubepods.slice` ·
    `qpolicy trace --replay h200-pytorch-matmul`
    """
    if replay_file is None:
        device_filter = DeviceFilter.parse(devices) if devices else None
        probe = NvProbe(device_filter, libcuda=None if libcuda == "none" else libcuda)
        if ebpf:
            sys.stdout.write(probe.source())
            return
        trace_live(probe, interval, duration, cgroup, json_output)
        return
    if ebpf or devices or cgroup is not None or duration is not None:
        raise ValidationError("--ebpf, --cgroup, --duration and --device are for live tracing")
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


def trace_live(
    probe: NvProbe,
    interval: float,
    duration: float | None,
    cgroup: str | None,
    json_output: bool,
) -> None:
    cgroups = CgroupMap()
    wanted = None if cgroup is None else normalize(cgroup)
    # Ctrl-C only asks the loop to stop, from before the probe loads until it is detached: a
    # KeyboardInterrupt raised inside bcc's poll callback is dropped by ctypes (see live.stop_on).
    # A Ctrl-C during the load stops the trace as soon as it starts, after one snapshot.
    with live.stop_on(signal.SIGINT) as stop, probe:
        view = live.LiveView(probe, cgroups, wanted)
        # bcc tools' banner: scripts wait for it to know the probe is attached.
        err_console.print(
            f"Tracing {_watching(probe)}; libcuda launches: "
            f"{probe.features.get('launch_symbols')}... Hit Ctrl-C to end.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if json_output:
            live.run(view, interval, duration, _print_line, stop=stop)
            return
        with Live(_live_table(None), console=console, auto_refresh=False) as screen:

            def show(snapshot: live.Snapshot) -> None:
                screen.update(_live_table(snapshot), refresh=True)

            live.run(view, interval, duration, show, stop=stop)


def _watching(probe: NvProbe) -> str:
    if len(probe.devices.exact) + len(probe.devices.majors) <= 8:
        return f"devices {probe.devices.describe()}"
    return "the NVIDIA device files"


def _print_line(snapshot: live.Snapshot) -> None:
    sys.stdout.write(json.dumps(snapshot.to_json()) + "\n")
    sys.stdout.flush()


def _live_table(snapshot: live.Snapshot | None) -> Table:
    lost = "" if snapshot is None or not snapshot.lost else f", {snapshot.lost} events lost"
    table = Table(title=f"NVIDIA driver traffic per cgroup{lost}", title_justify="left")
    table.add_column("cgroup", overflow="fold")
    table.add_column("procs", justify="right")
    table.add_column("ioctl/s", justify="right")
    table.add_column("launch/s", justify="right")
    table.add_column("TSGs", justify="right")
    table.add_column("channels", justify="right")
    table.add_column("device mem", justify="right")
    for row in snapshot.rows if snapshot is not None else ():
        table.add_row(
            row.cgroup,
            str(row.processes),
            f"{row.ioctls_per_s:.1f}",
            f"{row.launches_per_s:.1f}",
            str(row.tsgs),
            str(row.channels),
            format_bytes(row.device_bytes),
        )
    return table
