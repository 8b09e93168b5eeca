"""Reference sliding window (R-SWA): the prompt stays visible, decoded tokens slide."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagedkv.specs.base import check_fields
from pagedkv.specs.full import FullAttentionSpec

__all__ = [
    "RSWASpec",
]


@dataclass(frozen=True, kw_only=True)
class RSWASpec(FullAttentionSpec):
    """Every prompt token is attended by every later token; of the generated tokens only
    the last ``rswa_window`` are. Blocks wholly between the prompt and that window are
    freed while the request runs, so a request holds at most its prompt plus the window
    (sized as full attention: that never exceeds ``max_model_len``)."""

    rswa_window: int

    kind: ClassVar[str] = "rswa"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "rswa_window")

    @property
    def vllm_kind(self) -> str:
        return "full_attention"
