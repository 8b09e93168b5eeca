"""The ``pagedkv`` command: the typer app and the one place its commands are registered.

Each command is a plain function in its own module; those modules never import this one.
Adding a command is one ``app.command(NAME)(function)`` line below.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer
from typer._click.exceptions import ClickException, UsageError

from pagedkv.cli.catalog import gpus_command, models_command
from pagedkv.cli.common import stderr_console
from pagedkv.cli.plan import plan_command
from pagedkv.cli.simulate import simulate_command
from pagedkv.errors import PagedKVError

app = typer.Typer(
    name="pagedkv",
    help="Plan and inspect the paged KV cache of LLM inference engines.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from pagedkv._version import __version__

        print(f"pagedkv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks on errors (accepted by every command)."
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """Plan and inspect the paged KV cache of LLM inference engines."""


app.command("plan")(plan_command)
app.command("simulate")(simulate_command)
app.command("models")(models_command)
app.command("gpus")(gpus_command)


def _usage_line(exc: UsageError) -> str:
    """Click's usage error as one line, naming the command's --help."""
    message = " ".join(exc.format_message().split())
    command = exc.ctx.command_path if exc.ctx is not None else "pagedkv"
    return f"{message} (see '{command} --help')"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; errors print one line (``--debug`` anywhere shows the traceback)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        result = app(args=args, prog_name="pagedkv", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        stderr_console().print("aborted")
        return 1
    except UsageError as exc:
        if debug:
            raise
        stderr_console().print(f"error: {_usage_line(exc)}", markup=False)
        return 2
    except ClickException as exc:
        if debug:
            raise
        stderr_console().print(f"error: {exc.format_message()}", markup=False)
        return int(exc.exit_code)
    except PagedKVError as exc:
        if debug:
            raise
        stderr_console().print(f"error: {exc}", markup=False)
        return 1
    except Exception as exc:
        if debug:
            raise
        stderr_console().print(
            f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            markup=False,
        )
        return 1
    return result if isinstance(result, int) else 0
