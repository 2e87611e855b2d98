"""``qpolicy daemon``: the node agent."""

from __future__ import annotations

import logging
import math
import sys
from typing import Annotated

import typer

from qpolicy.cli.output import err_console
from qpolicy.cli.simulate import load_scenario_argument
from qpolicy.daemon import (
    Daemon,
    DaemonConfig,
    EnforcerKind,
    ProbeMode,
    choose_enforcer,
    install_signal_handlers,
)
from qpolicy.errors import ValidationError
from qpolicy.state import default_state_dir
from qpolicy.telemetry.exporter import DEFAULT_METRICS_ADDR, parse_metrics_addr


def _parse_enforcer(text: str) -> EnforcerKind:
    try:
        return EnforcerKind(text.strip().lower())
    except ValueError:
        choices = ", ".join(kind.value for kind in EnforcerKind)
        raise ValidationError(f"invalid enforcer {text!r}: expected one of {choices}") from None


def _parse_probe(text: str) -> ProbeMode:
    try:
        return ProbeMode(text.strip().lower())
    except ValueError:
        raise ValidationError(f"invalid probe mode {text!r}: expected auto, on or off") from None


_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def _parse_number(text: str, what: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"invalid {what} {text!r}: expected a number") from None
    if not low <= value <= high:  # also refuses nan
        raise ValidationError(f"invalid {what} {text!r}: must be from {low:g} to {high:g}")
    return value


def _parse_positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"invalid {what} {text!r}: expected a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValidationError(f"invalid {what} {text!r}: must be more than 0")
    return value


def daemon(
    *,
    enforcer: Annotated[
        str,
        typer.Option(
            "--enforcer",
            metavar="KIND",
            help="**auto** (kmod where qgpu.ko is loaded, rm where NVIDIA devices exist, else "
            "sim), **rm** (RM controls from userspace; root), **sim** (run --scenario on the "
            "simulated GPU), **none** (observe only), **kmod** (qgpu.ko runs the periods; "
            "needs the module loaded and CAP_NET_ADMIN).",
        ),
    ] = "auto",
    metrics_addr: Annotated[
        str,
        typer.Option(
            "--metrics-addr",
            metavar="IP:PORT",
            help="Where to serve Prometheus metrics.",
            envvar="QPOLICY_METRICS_ADDR",
        ),
    ] = DEFAULT_METRICS_ADDR,
    no_metrics: Annotated[bool, typer.Option("--no-metrics", help="Do not serve metrics.")] = False,
    scenario: Annotated[
        str | None,
        typer.Option(
            "--scenario",
            metavar="NAME|FILE",
            help="The scenario the sim enforcer runs (repeated when it ends).",
        ),
    ] = None,
    speed: Annotated[
        str, typer.Option("--speed", metavar="X", help="Run the simulation X times real time.")
    ] = "1",
    tick_ms: Annotated[
        str, typer.Option("--tick-ms", metavar="MS", help="How often sources are read.")
    ] = "100",
    min_turn_ms: Annotated[
        str,
        typer.Option(
            "--min-turn-ms",
            metavar="MS",
            help="rm enforcer: the shortest turn an offline pod gets when pods take turns; the "
            "period is stretched to fit (each hand-over costs two RM controls, ~1 ms of CPU "
            "each). 0: turns as short as the period makes them.",
        ),
    ] = "200",
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            metavar="LEVEL",
            help="**info** (what could not be done), **debug** (every period, turn and control), "
            "**warning**.",
        ),
    ] = "info",
    probe: Annotated[
        str | None,
        typer.Option(
            "--probe",
            metavar="auto|on|off",
            help="Load the eBPF probe (needs root and python3-bpfcc). Default: auto, except "
            "under the sim enforcer. **auto** carries on without it if it cannot load.",
        ),
    ] = None,
) -> None:
    """Run the node agent: read the desired state and telemetry, enforce, serve metrics.

    Stops cleanly on SIGTERM or SIGINT.
    """
    kind = _parse_enforcer(enforcer)
    level = _LOG_LEVELS.get(log_level.lower())
    if level is None:
        raise ValidationError(
            f"invalid log level {log_level!r}: expected one of {', '.join(_LOG_LEVELS)}"
        )
    if not no_metrics:
        parse_metrics_addr(metrics_addr)
    if probe is None:
        probe_mode = ProbeMode.OFF if choose_enforcer(kind) is EnforcerKind.SIM else ProbeMode.AUTO
    else:
        probe_mode = _parse_probe(probe)
    config = DaemonConfig(
        enforcer=kind,
        probe=probe_mode,
        state_dir=default_state_dir(),
        metrics_addr=None if no_metrics else metrics_addr,
        scenario=load_scenario_argument(scenario) if scenario is not None else None,
        speed=_parse_positive(speed, "speed"),
        tick_s=_parse_positive(tick_ms, "tick") / 1000,
        min_turn_ms=_parse_number(min_turn_ms, "minimum turn", 0, 10_000),
    )
    # The enforcers report what they could not do (a process gone, a control refused) through
    # logging; a daemon's stderr is its journal.
    stamp = "%(relativeCreated)10.1f ms " if level == logging.DEBUG else ""
    logging.basicConfig(
        level=level, format=f"qpolicy daemon: {stamp}%(levelname)s %(name)s: %(message)s"
    )
    agent = Daemon(config)
    install_signal_handlers(agent)
    if agent.probe_error is not None:
        err_console.print(
            f"qpolicy daemon: running without the eBPF probe: {agent.probe_error}",
            markup=False,
            highlight=False,
        )
    opened, problems = agent.restored
    if opened or problems:
        err_console.print(
            f"qpolicy daemon: re-opened {opened} channel group(s) a previous daemon had closed"
            + (f"; {len(problems)} could not be: {problems[0]}" if problems else ""),
            markup=False,
            highlight=False,
        )
    if config.metrics_addr is not None:
        err_console.print(
            f"qpolicy daemon: enforcer {agent.kind.value}, "
            f"metrics on http://{config.metrics_addr}/metrics",
            markup=False,
            highlight=False,
        )
    sys.stdout.flush()
    raise typer.Exit(agent.run())
