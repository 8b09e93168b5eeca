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
from pagedkv.cli.generate import generate_command
from pagedkv.cli.plan import plan_command
from pagedkv.cli.route import route_app
from pagedkv.cli.serve import serve_command
from pagedkv.cli.simulate import simulate_command
from pagedkv.errors import PagedKVError

__all__ = [
    "app",
    "main",
]

app = typer.Typer(
    name="pagedkv",
    help="Plan and inspect the paged KV cache of LLM inference engines.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
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


app.command("plan", short_help="Plan a model's KV cache on a GPU.")(plan_command)
app.command("simulate", short_help="Replay a trace through the KV cache.")(simulate_command)
app.command("models", short_help="List the bundled model configs.")(models_command)
app.command("gpus", short_help="List the GPU table and its aliases.")(gpus_command)
app.command("generate", short_help="Generate with a transformers model on pagedkv.")(
    generate_command
)
app.command("serve", short_help="Serve a model over an OpenAI-compatible API.")(serve_command)
app.add_typer(route_app, name="route", short_help="KV-aware routing across engines.")


def _usage_line(exc: UsageError) -> str:
    """Click's usage error as one line, naming the command's --help."""
    message = " ".join(exc.format_message().split())
    command = exc.ctx.command_path if exc.ctx is not None else "pagedkv"
    return f"{message} (see '{command} --help')"


def _one_line(exc: Exception) -> tuple[str, int]:
    """The error line and exit code: 2 for usage errors, 1 for bad input and the rest."""
    if isinstance(exc, UsageError):
        return _usage_line(exc), 2
    if isinstance(exc, ClickException):
        return exc.format_message(), int(exc.exit_code)
    if isinstance(exc, PagedKVError):
        return str(exc), 1
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", 1


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
    except Exception as exc:
        if debug:
            raise
        message, code = _one_line(exc)
        stderr_console().print(f"error: {message}", markup=False)
        return code
    return result if isinstance(result, int) else 0
