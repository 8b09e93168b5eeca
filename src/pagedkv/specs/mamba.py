"""Mamba / linear-attention state: a fixed-size state per request, not per token."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.config import MambaCacheMode, check_choice
from pagedkv.dtypes import get_kv_dtype
from pagedkv.errors import KVCacheSpecError
from pagedkv.specs.base import KVCacheSpec, all_match, cdiv, check_fields, spec_dtype_name

__all__ = [
    "MambaSpec",
    "prefill_checkpoint_position",
    "prefill_checkpoint_exportable",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


def _normalize_shapes(name: str, shapes: Any) -> tuple[tuple[int, ...], ...]:
    try:
        if isinstance(shapes, str | bytes) or any(isinstance(s, str | bytes) for s in shapes):
            raise TypeError
        raw = [tuple(shape) for shape in shapes]
        if any(isinstance(d, bool) for shape in raw for d in shape):
            raise TypeError
        result = tuple(tuple(operator.index(d) for d in shape) for shape in raw)
    except TypeError:
        result = ()
    if not result or not all(result) or min(d for shape in result for d in shape) <= 0:
        raise KVCacheSpecError(
            f"{name}.shapes must be a non-empty sequence of shapes whose dimensions are "
            f"positive integers, got {shapes!r}"
        )
    return result


def _normalize_dtypes(spec: KVCacheSpec, dtypes: Any) -> tuple[str, ...]:
    if isinstance(dtypes, str) or not isinstance(dtypes, Iterable):
        dtypes = (dtypes,)
    return tuple(spec_dtype_name(spec, "dtypes", d) for d in dtypes)


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """State tensors (``shapes`` with ``dtypes``) per request. ``mamba_cache_mode``
    ``"none"``: one block, never cached; ``"align"``: a checkpoint per ``block_size``.
    ``num_prefill_checkpoint_blocks`` > 0 (vLLM's Mamba-2 and gated-DeltaNet layers): a
    prefill chunk may end past its last block boundary, the kernel exporting the state at
    that boundary into one extra block; ``prefill_checkpoint_alignment``: the token step
    the kernel can export at (None: it cannot)."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: MambaCacheMode = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None

    kind: ClassVar[str] = "mamba"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        object.__setattr__(self, "shapes", _normalize_shapes(name, self.shapes))
        object.__setattr__(self, "dtypes", _normalize_dtypes(self, self.dtypes))
        if len(self.shapes) != len(self.dtypes):
            raise KVCacheSpecError(
                f"{name}.shapes has {len(self.shapes)} tensors but {name}.dtypes has "
                f"{len(self.dtypes)}"
            )
        check_choice(self, "mamba_cache_mode", "none", "align", error=KVCacheSpecError)
        check_fields(self, "num_speculative_blocks", minimum=0)
        check_fields(self, "num_prefill_checkpoint_blocks", minimum=0)
        check_fields(self, "prefill_checkpoint_alignment", allow_none=True)
        check_fields(self, "page_size_padded", allow_none=True)
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise KVCacheSpecError(
                f"{name}.page_size_padded ({self.page_size_padded}) is smaller than the "
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
        # Align mode holds the running state, the last checkpoint and the prefill ones.
        if self.mamba_cache_mode == "align":
            live = 2 + self.num_prefill_checkpoint_blocks
        else:
            live = 1
        return self.page_size_bytes * (live + self.num_speculative_blocks)

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        if self.mamba_cache_mode == "align":
            length = config.max_model_len if max_model_len is None else max_model_len
            return cdiv(length, self.block_size) + self.num_speculative_blocks
        return 1 + self.num_speculative_blocks

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        names = (
            "num_speculative_blocks",
            "num_prefill_checkpoint_blocks",
            "prefill_checkpoint_alignment",
            "page_size_bytes",
            "mamba_cache_mode",
        )
        return all_match(kv_cache_specs, MambaSpec, self, *names)


def prefill_checkpoint_position(
    num_tokens: int,
    hash_block_size: int,
    drop_eagle_block: bool = False,
    num_hash_lookahead_tokens: int = 0,
) -> int:
    """The last hash boundary a prefill of ``num_tokens`` tokens can checkpoint its state at
    and a later request hit: at least one token (or the hash lookahead) must follow it, so
    the last token is recomputed for logits; an EAGLE block drop backs off one more unit.

    Args:
        num_tokens: tokens the prefill computes.
        hash_block_size: tokens per prefix-cache hash block.
        drop_eagle_block: whether EAGLE drops the last block (back off one more hash block).
        num_hash_lookahead_tokens: tokens that must follow the checkpoint (at least one is kept
            regardless).
    """
    if drop_eagle_block:
        limit = num_tokens
    else:
        limit = num_tokens - max(1, num_hash_lookahead_tokens)
    position = limit // hash_block_size * hash_block_size
    if drop_eagle_block:
        position -= hash_block_size
    return max(position, 0)


def prefill_checkpoint_exportable(
    query_start: int,
    query_end: int,
    checkpoint_position: int,
    hash_block_size: int,
    mamba_block_size: int,
    checkpoint_alignment: int | None,
) -> bool:
    """Whether a kernel computing tokens ``[query_start, query_end)`` can export the state
    at ``checkpoint_position`` into a block of its own: the chunk starts on a hash boundary,
    spans at least one hash block before the position and one block column past its
    initial state, and the position is ``checkpoint_alignment`` steps from its start.

    Args:
        query_start: first token position the kernel computes.
        query_end: one past the last token position the kernel computes.
        checkpoint_position: token position whose state would be exported.
        hash_block_size: tokens per prefix-cache hash block.
        mamba_block_size: tokens per Mamba state block column.
        checkpoint_alignment: tokens between the chunk start and an exportable position (None: the
            kernel exports no internal checkpoints).
    """
    if checkpoint_alignment is None:
        return False
    initial_state_column = (query_start - 1) // mamba_block_size
    checkpoint_column = cdiv(query_end, mamba_block_size) - 2
    return (
        query_start % hash_block_size == 0
        and checkpoint_column > initial_state_column
        and query_start + hash_block_size <= checkpoint_position
        and query_start < checkpoint_position < query_end
        and (checkpoint_position - query_start) % checkpoint_alignment == 0
    )
