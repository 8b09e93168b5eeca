"""How figures are written for people: byte sizes in binary units, counts with
thousands separators, shares as percentages."""

from __future__ import annotations

__all__ = ["format_bytes", "format_int", "format_percent"]


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


def format_percent(fraction: float | None) -> str:
    """``0.1234`` as ``12.34 %``; ``-`` for None (not measured)."""
    return "-" if fraction is None else f"{100 * fraction:.2f} %"
