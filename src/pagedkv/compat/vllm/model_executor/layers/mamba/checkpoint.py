"""vLLM's ``vllm.model_executor.layers.mamba.checkpoint``: where each prefill row writes its
Mamba checkpoint, by pagedkv's rules (``pagedkv.specs.mamba``)."""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.specs.base import cdiv
from pagedkv.specs.mamba import prefill_checkpoint_exportable, prefill_checkpoint_position

__all__ = ["compute_mamba_prefill_checkpoints"]


def compute_mamba_prefill_checkpoints(
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    hash_block_size: int,
    mamba_block_size: int,
    checkpoint_alignment: int | None,
    drop_eagle_block: bool,
    cache_hit_alignment_tokens: int,
    num_hash_lookahead_tokens: int = 0,
) -> tuple[list[int], list[int]]:
    """Per row: the checkpoint's offset into its query and its block-table column
    (``0`` and ``-1`` when the row exports none)."""
    offsets: list[int] = []
    columns: list[int] = []
    for seq_len, query_len in zip(seq_lens, query_lens, strict=True):
        query_start = seq_len - query_len
        position = prefill_checkpoint_position(
            seq_len, cache_hit_alignment_tokens, drop_eagle_block, num_hash_lookahead_tokens
        )
        exported = prefill_checkpoint_exportable(
            query_start,
            seq_len,
            position,
            hash_block_size,
            mamba_block_size,
            checkpoint_alignment,
        )
        offsets.append(position - query_start if exported else 0)
        columns.append(cdiv(seq_len, mamba_block_size) - 2 if exported else -1)
    return offsets, columns
