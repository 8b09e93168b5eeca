"""An int8 KV cache whose scales are stored per block, next to the values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagedkv.errors import KVCacheSpecError
from pagedkv.specs import FullAttentionSpec


@dataclass(frozen=True, kw_only=True)
class BlockScaledInt8Spec(FullAttentionSpec):
    """Full attention stored as int8, with one scale per (block, KV head, K or V).

    Page bytes = values + scales:
    ``block_size * num_kv_heads * (head_size + head_size_v)`` bytes of int8 values,
    plus ``num_kv_heads * 2 * scale_bytes`` bytes of scales.
    """

    dtype: str = "int8"
    scale_bytes: int = 4  # fp32 scales

    kind: ClassVar[str] = "block_scaled_int8"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype != "int8":
            raise KVCacheSpecError(
                f"{type(self).__name__}.dtype must be int8 (the scales make it int8), "
                f"got {self.dtype!r}"
            )
        if not isinstance(self.scale_bytes, int) or self.scale_bytes <= 0:
            raise KVCacheSpecError(
                f"{type(self).__name__}.scale_bytes must be a positive integer, "
                f"got {self.scale_bytes!r}"
            )

    @property
    def scale_bytes_per_block(self) -> int:
        """Scale bytes one block of one layer holds: one per KV head for K and for V."""
        return self.num_kv_heads * 2 * self.scale_bytes

    @property
    def real_page_size_bytes(self) -> int:
        return super().real_page_size_bytes + self.scale_bytes_per_block
