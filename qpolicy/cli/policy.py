"""``qpolicy set``: the policy of one GPU."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from qpolicy.cli.output import JsonOption, console, print_json, state_store
from qpolicy.model import (
    MAX_PERIOD_MS,
    MIN_PERIOD_MS,
    GpuConfig,
    GpuPolicy,
    parse_period_ms,
)
from qpolicy.state import DesiredState
from qpolicy.telemetry.gpus import parse_gpu


def set_policy(
    *,
    gpu: Annotated[
        str,
        typer.Option(
            "--gpu",
            metavar="N|UUID",
            help="GPU index (as nvidia-smi numbers them) or UUID (GPU-...).",
        ),
    ],
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            metavar="POLICY",
            help="**best-effort** (be, best), **fixed-share** (fs, fixed) or **burst-share** "
            "(bs, burst); case, hyphens and underscores do not matter.",
        ),
    ],
    period_ms: Annotated[
        str | None,
        typer.Option(
            "--period-ms",
            metavar="MS",
            help=f"Scheduling period, {MIN_PERIOD_MS} to {MAX_PERIOD_MS} ms. "
            "Default: keep the GPU's current period.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Set the time-slicing policy of a GPU.

    fixed-share and burst-share need every pod on the GPU to have a share, summing to at most 100.
    """
    # Parsed here, as strings, so that a bad value is reported in the model's words and before
    # the state file is touched.
    index = parse_gpu(gpu)
    new_policy = GpuPolicy.parse(policy)
    period = parse_period_ms(period_ms) if period_ms is not None else None

    def change(state: DesiredState) -> DesiredState:
        current = state.gpu(index)
        return state.with_gpu(
            GpuConfig(index, new_policy, current.period_ms if period is None else period)
        )

    config = state_store().update(change).gpu(index)
    if as_json:
        print_json({"gpu": index, "policy": config.policy.value, "period_ms": config.period_ms})
        return
    console.print(
        f"GPU {index}: [b]{escape(config.policy.value)}[/b], period {config.period_ms} ms",
        soft_wrap=True,
    )
