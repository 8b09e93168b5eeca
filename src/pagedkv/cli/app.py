"""The ``pagedkv`` command: the typer app and the one place its commands are registered.

Each command is a plain function in its own module; those modules never import this one.
Adding a command is one ``app.command(NAME)(function)`` line below.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

from pagedkv.cli.catalog import gpus_command, models_command
from pagedkv.cli.common import stderr_console
from pagedkv.cli.plan import plan_command
from pagedkv.cli.route import route_app
from pagedkv.cli.simulate import simulate_command
from pagedkv.errors import PagedKVError

app = typer.Typer(
    name="pagedkv",
    help="Plan and inspect the paged KV cache of LLM inference engines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks on errors (accepted by every command)."
    ),
) -> None:
    """Plan and inspect the paged KV cache of LLM inference engines."""


app.command("plan")(plan_command)
app.command("simulate")(simulate_command)
app.command("models")(models_command)
app.command("gpus")(gpus_command)
app.add_typer(route_app, name="route")


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
    except typer.TyperException as exc:  # typer vendors click: usage errors land here
        if debug:
            raise
        show = getattr(exc, "show", None)
        if show is None:
            stderr_console().print(f"error: {exc}", markup=False)
        else:
            show()
        return int(getattr(exc, "exit_code", 2))
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
