"""What the commands share: the consoles, the state store, JSON and number formatting."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from qpolicy.state import StateStore

# Both consoles look up sys.stdout / sys.stderr when they print, so redirection and pytest's
# capture see their output. Colour and styles only appear on a terminal.
console = Console()
err_console = Console(stderr=True)


# Every command that prints a result takes --json: one JSON document on stdout instead of text.
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON document instead of text.")
]


def state_store() -> StateStore:
    """The store at $QPOLICY_STATE_DIR (or /var/lib/qpolicy), looked up on every command."""
    return StateStore()


def print_json(data: object) -> None:
    # Plain json, never through rich: a pod id that looks like markup must come out as it is.
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def print_own_timeslices(subject: str, closed_for_online: bool = False) -> None:
    """Say that a pod's TSGs keep their own timeslices (several of its CUDA contexts on a GPU), and
    what that costs: the same words for either enforcer. qgpu.ko (online_gate 1 or 2) closes such
    a pod while online work runs instead, two RM controls per online burst. ``subject`` comes
    escaped."""
    cost = (
        "qgpu closes it while online work runs (two RM controls a burst)"
        if closed_for_online
        else "online work next to it waits as under native time-slicing"
    )
    console.print(
        f"[yellow]{subject}: its TSGs keep their own timeslices, and {cost}[/yellow]",
        soft_wrap=True,
    )


def percent(value: int | None) -> str:
    return "-" if value is None else f"{value} %"
