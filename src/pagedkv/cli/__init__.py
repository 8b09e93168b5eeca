"""Command-line interface (``pagedkv``)."""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point."""
    from pagedkv.cli.app import main as run

    sys.exit(run())


__all__ = ["main"]
