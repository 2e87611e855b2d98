"""The error boundary: every failure becomes one line on stderr and an exit status.

Click (vendored inside typer) would print a usage block and a boxed error for a usage mistake, and
a traceback for a library error. Scripts around qpolicy want one predictable line instead:
``qpolicy: error: <message>``, with 2 for anything the user got wrong and 1 for the rest.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence

import typer
from rich.text import Text
from typer import _click as click

from qpolicy.cli.output import err_console
from qpolicy.errors import QPolicyError

PROG = "qpolicy"


def error_line(message: str) -> None:
    # Messages quote user input and may span lines (click's "Did you mean" hints); keep one line.
    flat = " ".join(line.strip() for line in message.splitlines() if line.strip())
    err_console.print(
        Text.assemble((f"{PROG}: error: ", "bold red"), flat), soft_wrap=True, highlight=False
    )


def run(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` (default: sys.argv[1:]) and return the exit status."""
    command = typer.main.get_command(app)
    _plain_types(command)
    try:
        # Not standalone: click then raises instead of printing and exiting itself, and returns
        # the status of --help / --version / typer.Exit.
        result = command.main(args=argv, prog_name=PROG, standalone_mode=False)
    except QPolicyError as error:
        error_line(str(error))
        return error.exit_code
    except typer.TyperException as error:
        # no_args_is_help: typer has already printed the help (its own handler skips this error
        # by name as well, the class is not public).
        if type(error).__name__ != "NoArgsIsHelpError":
            error_line(_usage_message(error))
        return error.exit_code
    except typer.Abort:
        error_line("aborted")
        return 1
    except Exception as error:
        if os.environ.get("QPOLICY_DEBUG"):
            traceback.print_exc()
        error_line(
            f"internal error: {type(error).__name__}: {error} (QPOLICY_DEBUG=1 shows the traceback)"
        )
        return 1
    return result if isinstance(result, int) else 0


def _usage_message(error: typer.TyperException) -> str:
    message = error.format_message()
    ctx = getattr(error, "ctx", None)
    if ctx is not None:
        message = f"{message} (see '{ctx.command_path} --help')"
    return message


def _plain_types(command: click.Command) -> None:
    """Help shows a metavar where one says more than a type: nothing for flags (``--json``, not
    ``--json <bool>``) and for arguments named by their metavar (``ID``, not ``ID <str>``)."""
    for param in command.params:
        if getattr(param, "is_flag", False) or (
            param.param_type_name == "argument" and param.metavar is not None
        ):
            setattr(param, "display_type_rich", _no_type)  # noqa: B010
    help_option = command.get_help_option

    def plain_help_option(ctx: click.Context) -> click.Parameter | None:
        option = help_option(ctx)
        if option is not None:
            setattr(option, "display_type_rich", _no_type)  # noqa: B010
        return option

    setattr(command, "get_help_option", plain_help_option)  # noqa: B010
    for sub in getattr(command, "commands", {}).values():
        _plain_types(sub)


def _no_type(ctx: click.Context) -> None:
    return None
