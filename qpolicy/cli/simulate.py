"""``qpolicy sim`` and ``qpolicy demo``: the policies on a simulated GPU, no root, no GPU."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from qpolicy.backends.base import BackendFactory
from qpolicy.cli.output import console, err_console, print_json
from qpolicy.errors import ValidationError
from qpolicy.sim.analysis import Phase, phases
from qpolicy.sim.backend import SimBackend
from qpolicy.sim.report import latency_table, phases_table, pods_table
from qpolicy.sim.runner import SimResult, run
from qpolicy.sim.scenario import Scenario, load_scenario
from qpolicy.sim.scenarios import builtin, names

MAX_WINDOWS = 1_000_000


def sim_backend(scenario: Scenario, speed: float = 1.0) -> BackendFactory:
    """``qpolicy daemon --enforcer sim``: the simulated node as the daemon's backend."""
    return lambda context: SimBackend(context, scenario, speed)


def load_scenario_argument(argument: str) -> Scenario:
    """A scenario file, or the name of one shipped with qpolicy (a file of that name wins)."""
    path = Path(argument)
    if not path.exists() and argument in names():
        return builtin(argument)
    try:
        return load_scenario(path)
    except ValidationError as error:
        if path.exists():
            raise
        raise ValidationError(f"{error} (shipped scenarios: {', '.join(names())})") from None


def _parse_window(text: str, scenario: Scenario) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"invalid window {text!r}: expected seconds, e.g. 0.5") from None
    if not math.isfinite(value) or value <= 0 or value > scenario.duration_s:
        raise ValidationError(
            f"invalid window {text!r}: must be more than 0 and at most the scenario's "
            f"{scenario.duration_s:g} s"
        )
    if scenario.duration_s / value > MAX_WINDOWS:
        raise ValidationError(f"invalid window {text!r}: more than {MAX_WINDOWS} windows")
    return value


def _parse_seed(text: str) -> int:
    if not text.strip().isdigit():
        raise ValidationError(f"invalid seed {text!r}: expected a non-negative integer")
    return int(text)


def _plot_path(text: str | None) -> Path | None:
    if text is None:
        return None
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise ValidationError(f"invalid plot file {text!r}: the chart is a PNG, name it *.png")
    if not path.parent.is_dir():
        raise ValidationError(f"invalid plot file {text!r}: directory {str(path.parent)!r} missing")
    return path


def _write_plot(
    path: Path | None, result: SimResult, found: list[Phase], native: SimResult | None, quiet: bool
) -> None:
    if path is None:
        return
    from qpolicy.sim.plot import plot  # matplotlib is slow to import; only load it when asked

    plot(result, found, path, native=native)
    # Unwrapped and unstyled: the path is meant to be copied.
    (err_console if quiet else console).print(
        f"chart written to {path}", soft_wrap=True, markup=False, highlight=False
    )


JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print one JSON document instead of tables.")
]
SeedOption = Annotated[
    str, typer.Option("--seed", metavar="N", help="Seed of request arrivals and host jitter.")
]


def sim(
    scenario_file: Annotated[
        str,
        typer.Argument(
            metavar="SCENARIO.yaml",
            help="A scenario file (YAML), or the name of a shipped one: "
            + ", ".join(names())
            + ".",
        ),
    ],
    *,
    json_output: JsonFlag = False,
    window_s: Annotated[
        str, typer.Option("--window-s", metavar="W", help="Width of the reported time windows.")
    ] = "1",
    seed: SeedOption = "0",
    plot_file: Annotated[
        str | None, typer.Option("--plot", metavar="FILE.png", help="Also write a chart.")
    ] = None,
    native: Annotated[
        bool,
        typer.Option("--native", help="Run without qpolicy (native time-slicing), to compare."),
    ] = False,
) -> None:
    """Simulate a scenario on one GPU calibrated to an H200.

    Reports each pod's share of GPU time, throughput and request latency (next to the same requests
    on an idle GPU), and the policy's expected split in each phase of the run.
    """
    scenario = load_scenario_argument(scenario_file)
    window = _parse_window(window_s, scenario)
    seed_value = _parse_seed(seed)
    plot_path = _plot_path(plot_file)

    result = run(scenario, seed=seed_value, window_s=window, gated=not native)
    found = phases(scenario, result)
    if json_output:
        document: dict[str, Any] = result.to_json()
        document["phases"] = [phase.to_json() for phase in found]
        print_json(document)
    else:
        console.print(pods_table(result))
        label = "native" if native else "qpolicy"
        console.print(phases_table([(label, found)]))
    _write_plot(plot_path, result, found, None, quiet=json_output)


def demo(
    *,
    json_output: JsonFlag = False,
    seed: SeedOption = "0",
    plot_file: Annotated[
        str, typer.Option("--plot", metavar="FILE.png", help="Where to write the chart.")
    ] = "qpolicy-demo.png",
) -> None:
    """Watch burst-share and the online/offline classes work on a simulated GPU.

    An online inference pod and two offline trainers (the second starts 8 s in) share one
    simulated H200 under burst-share. The same run without qpolicy, on native time-slicing, is
    shown next to it.
    """
    seed_value = _parse_seed(seed)
    plot_path = _plot_path(plot_file)
    scenario = builtin("demo")
    gated = run(scenario, seed=seed_value, window_s=0.25)
    native = run(scenario, seed=seed_value, window_s=0.25, gated=False)
    gated_phases = phases(scenario, gated)
    native_phases = phases(scenario, native)
    if json_output:
        print_json(
            {
                "scenario": "demo",
                "qpolicy": gated.to_json() | {"phases": [p.to_json() for p in gated_phases]},
                "native": native.to_json() | {"phases": [p.to_json() for p in native_phases]},
            }
        )
    else:
        console.print(
            "[bold]qpolicy demo[/bold]: an online inference pod (50 requests/s, share 20) and two "
            "offline trainers (shares 50 and 30; train-b starts at 8 s) on one simulated H200 "
            "under burst-share, 20 s.\n"
        )
        console.print(phases_table([("qpolicy", gated_phases), ("native", native_phases)]))
        table = latency_table([("qpolicy", gated), ("native", native)])
        if table is not None:
            console.print(table)
    _write_plot(plot_path, gated, gated_phases, native, quiet=json_output)
