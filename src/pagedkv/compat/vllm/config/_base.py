"""A plain settings object: vLLM's config fields with their defaults, set by keyword."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, ClassVar


class ConfigPart:
    """Fields in ``DEFAULTS`` (any other keyword is kept as given)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self, **fields: Any) -> None:
        for name, value in self.DEFAULTS.items():
            setattr(self, name, copy.copy(value))
        for name, value in fields.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({body})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]

    if TYPE_CHECKING:  # fields are set by keyword, whatever vLLM's config names

        def __getattr__(self, name: str) -> Any: ...
