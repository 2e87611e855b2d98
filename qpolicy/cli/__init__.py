"""The ``qpolicy`` command: a thin shell over :mod:`qpolicy.state` and :mod:`qpolicy.engine`.

One module per command group; this one wires them into ``app`` and runs it behind the error
boundary (:mod:`qpolicy.cli.errors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from qpolicy import __version__
from qpolicy.cli import daemon, doctor, errors, policy, simulate, status, trace
from qpolicy.cli.kube import kube_app
from qpolicy.cli.pod import pod_app

app = typer.Typer(
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"qpolicy {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    *,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Share NVIDIA GPUs between containers by time slices.

    The desired state lives in *$QPOLICY_STATE_DIR/state.json*
    ($QPOLICY_STATE_DIR defaults to */var/lib/qpolicy*).
    """


# Desired state.
app.command("set")(policy.set_policy)
app.add_typer(pod_app, name="pod")
app.command("status")(status.status)

# Telemetry and the node agent.
app.command("trace")(trace.trace)
app.command("daemon")(daemon.daemon)
app.command("doctor")(doctor.doctor)
app.add_typer(kube_app, name="kube")

# Simulation.
app.command("sim")(simulate.sim)
app.command("demo")(simulate.demo)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``qpolicy`` console script (``argv`` defaults to sys.argv[1:])."""
    raise SystemExit(errors.run(app, argv))
