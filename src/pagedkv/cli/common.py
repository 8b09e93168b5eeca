"""Helpers every command shares: byte sizes, numbers, errors, consoles, common options."""

from __future__ import annotations

import re

from rich.console import Console

from pagedkv.errors import ConfigError

DEFAULT_GPU = "H100-80GB"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# One-letter suffixes as vLLM reads them: lowercase decimal, uppercase binary.
_LETTERS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_LETTERS |= {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Nothing pagedkv plans has a petabyte per device; larger figures are typos.
MAX_BYTES = 2**50
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str, option: str) -> int:
    """``80GiB``, ``80GB`` (decimal), ``40G`` (vLLM: GiB), ``1.5e9`` or an integer, as bytes."""
    match = _SIZE.match(text)
    unit = match.group(2) if match else ""
    scale = _LETTERS.get(unit) or _UNITS.get(unit.lower())
    if match is None or scale is None:
        raise ConfigError(
            f"{option}: cannot read {text!r} as a size (examples: 80GiB, 80GB, 85899345920)"
        )
    value = float(match.group(1)) * scale
    if not 1 <= value <= MAX_BYTES:
        raise ConfigError(
            f"{option}: size must be between 1 byte and {MAX_BYTES:,} bytes (1 PiB), got {text!r}"
        )
    return int(value)


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
    """Rich output at the terminal's width, or ``$COLUMNS`` (80 if unset) when piped."""
    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)
