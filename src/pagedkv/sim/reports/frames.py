"""pandas DataFrames of simulation output (pandas is optional: imported only here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.errors import ConfigError

__all__ = [
    "dataframe",
    "html_table",
]


def dataframe(rows: Sequence[tuple[Any, ...]], columns: Sequence[str]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise ConfigError("a DataFrame needs pandas (pip install pandas)") from None
    return pd.DataFrame.from_records(list(rows), columns=list(columns))


def html_table(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """A two-column HTML table for notebooks."""
    from html import escape

    body = "".join(
        f"<tr><th style='text-align:left'>{escape(k)}</th><td>{escape(v)}</td></tr>"
        for k, v in rows
    )
    return f"<table><caption>{escape(title)}</caption>{body}</table>"
