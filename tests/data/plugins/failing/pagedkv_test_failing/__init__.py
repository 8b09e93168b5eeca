"""A general plugin that fails: pagedkv must name it in the error."""

from __future__ import annotations


def register() -> None:
    raise RuntimeError("the plugin's device library is missing")
