"""Helpers every command shares: byte sizes, numbers, errors, consoles, common options."""

from __future__ import annotations

import re

import typer
from rich.console import Console

from pagedkv.errors import ConfigError

DEFAULT_GPU = "H100-80GB"

# Options that `plan` and `simulate` take with the same meaning.
TP_OPTION = typer.Option(1, "--tp", min=1, help="Tensor parallel size.")
PP_OPTION = typer.Option(1, "--pp", min=1, help="Pipeline parallel size.")
BLOCK_SIZE_OPTION = typer.Option(16, "--block-size", min=1, help="Tokens per block.")
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON object.")

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str, option: str) -> int:
    """``80GiB``, ``80GB`` (decimal), ``1.5e9`` or a plain integer, as bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{option}: cannot read {text!r} as a size (examples: 80GiB, 80GB, 85899345920)"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"{option}: size must be positive, got {text!r}")
    return value


def format_bytes(num_bytes: float) -> str:
    """Binary units with two decimals: ``1.50 GiB``."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_int(value: int) -> str:
    return f"{value:,}"


def stdout_console() -> Console:
    """Rich output; when piped, wide enough that tables never truncate."""
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=False, width=120)
    return console


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)
