"""Mamba / linear-attention state: a fixed-size state per request, not per token."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.config import MambaCacheMode
from pagedkv.dtypes import canonical_dtype_name, get_kv_dtype
from pagedkv.errors import KVCacheSpecError
from pagedkv.specs.base import KVCacheSpec, cdiv, check_positive_int

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """State tensors (``shapes`` with ``dtypes``) per request.

    ``mamba_cache_mode="none"``: one state block per request, never cached.
    ``"align"``: the state at every ``block_size`` boundary can be cached as a
    checkpoint (prefix caching for state layers).
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: MambaCacheMode = "none"
    num_speculative_blocks: int = 0

    kind: ClassVar[str] = "mamba"

    def __post_init__(self) -> None:
        super().__post_init__()
        shapes: Any = self.shapes
        dtypes: Any = self.dtypes
        if isinstance(dtypes, str) or not hasattr(dtypes, "__iter__"):
            dtypes = (dtypes,)
        object.__setattr__(self, "shapes", tuple(tuple(int(d) for d in s) for s in shapes))
        object.__setattr__(self, "dtypes", tuple(canonical_dtype_name(d) for d in dtypes))
        if not self.shapes:
            raise KVCacheSpecError("MambaSpec.shapes must name at least one state tensor")
        if len(self.shapes) != len(self.dtypes):
            raise KVCacheSpecError(
                f"MambaSpec.shapes has {len(self.shapes)} tensors but dtypes has {len(self.dtypes)}"
            )
        for shape in self.shapes:
            if not shape or any(d <= 0 for d in shape):
                raise KVCacheSpecError(f"MambaSpec.shapes has an invalid shape {shape}")
        if self.mamba_cache_mode not in ("none", "align"):
            raise KVCacheSpecError(
                f"MambaSpec.mamba_cache_mode must be 'none' or 'align', "
                f"got {self.mamba_cache_mode!r}"
            )
        if not isinstance(self.num_speculative_blocks, int) or self.num_speculative_blocks < 0:
            raise KVCacheSpecError("MambaSpec.num_speculative_blocks must be >= 0")
        check_positive_int(self, "page_size_padded", self.page_size_padded, allow_none=True)
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise KVCacheSpecError(
                f"MambaSpec.page_size_padded ({self.page_size_padded}) is smaller than the "
                f"state size ({self.real_page_size_bytes})"
            )

    @property
    def real_page_size_bytes(self) -> int:
        return sum(
            get_kv_dtype(dt).bytes_per_vector(math.prod(shape))
            for shape, dt in zip(self.shapes, self.dtypes)
        )

    @property
    def page_size_bytes(self) -> int:
        return self.real_page_size_bytes if self.page_size_padded is None else self.page_size_padded

    @property
    def prefix_cacheable(self) -> bool:
        return self.mamba_cache_mode == "align"

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        # Align mode holds the running state plus the last checkpoint.
        live = 2 if self.mamba_cache_mode == "align" else 1
        return self.page_size_bytes * (live + self.num_speculative_blocks)

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        if self.mamba_cache_mode == "align":
            length = config.max_model_len if max_model_len is None else max_model_len
            return cdiv(length, self.block_size) + self.num_speculative_blocks
        return 1 + self.num_speculative_blocks

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        return all(
            isinstance(s, MambaSpec)
            and s.num_speculative_blocks == self.num_speculative_blocks
            and s.page_size_bytes == self.page_size_bytes
            and s.mamba_cache_mode == self.mamba_cache_mode
            for s in kv_cache_specs.values()
        )
