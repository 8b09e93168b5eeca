"""Names from vLLM's ``vllm.v1.core.sched.scheduler``.

vLLM's scheduler is outside the KV cache layer: constructing ``Scheduler`` raises
``OutsideKVCacheLayerError``. Its helpers that decide KV cache questions are translated
and callable unbound on any object carrying the scheduler's attributes (as vLLM's tests
call them): the Mamba "align" chunk split (``pagedkv.specs.mamba_chunking``), the local
prefix-cache lookup a KV connector sees, and the release of copy-on-write retentions.
"""

from __future__ import annotations

from typing import Any

from pagedkv.compat.vllm._outside import OutsideKVCacheLayerError
from pagedkv.specs.mamba_chunking import MambaChunkRule, mamba_chunk_tokens

__all__ = ["Scheduler", "SchedulerOutput"]


def _max_chunk_tokens(scheduler: Any) -> int:
    limit = int(scheduler.max_num_scheduled_tokens)
    threshold = int(scheduler.scheduler_config.long_prefill_token_threshold)
    return min(limit, threshold) if threshold > 0 else limit


def _chunk_rule(scheduler: Any) -> MambaChunkRule:
    """The chunk-split settings read off a vLLM scheduler's attributes."""
    partial_hits = bool(scheduler.mamba_partial_cache_hit)
    internal = bool(scheduler.mamba_has_prefill_checkpoint_blocks)
    return MambaChunkRule(
        block_size=int(scheduler.cache_config.block_size),
        hash_block_size=int(scheduler.hash_block_size),
        max_chunk_tokens=_max_chunk_tokens(scheduler),
        partial_hits=partial_hits,
        coarse_block_size=0 if partial_hits else int(scheduler.block_size),
        drop_eagle_block=bool(scheduler.use_eagle_block_drop),
        num_hash_lookahead_tokens=int(scheduler.num_hash_lookahead_tokens),
        internal_checkpoints=internal,
        checkpoint_alignment=scheduler.mamba_prefill_checkpoint_alignment if internal else None,
        shared_prefix_checkpoint=bool(scheduler.mamba_shared_prefix_checkpoint),
    )


class Scheduler:
    """vLLM's scheduler: only its KV cache helpers are translated (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise OutsideKVCacheLayerError(
            "Scheduler is vLLM's scheduler, outside the KV cache layer that "
            "pagedkv.compat.vllm translates (docs/vllm-compat.md); its chunk split, local "
            "prefix-cache lookup and CoW release helpers can be called unbound"
        )

    def _mamba_block_aligned_split(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        start = (
            request.num_computed_tokens
            + num_new_local_computed_tokens
            + num_external_computed_tokens
        )
        if start >= max(request.num_prompt_tokens, request.num_tokens - 1):
            return num_new_tokens  # decode: no scheduler settings needed
        return mamba_chunk_tokens(
            _chunk_rule(self),
            start=start,
            num_new_tokens=num_new_tokens,
            num_prompt_tokens=request.num_prompt_tokens,
            num_tokens=request.num_tokens,
            junction=request.shared_prefix_boundary,
        )

    def _get_local_prefix_cache_hit(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int, bool]:
        """(blocks, local hit tokens, shared-prefix junction, per-group hits?): a connector
        that accepts groups hitting different lengths gets the per-group lookup."""
        manager = self.kv_cache_manager  # type: ignore[attr-defined]
        connector = self.connector  # type: ignore[attr-defined]
        if connector is not None and connector.supports_divergent_local_hybrid_hits:
            found: tuple[Any, int, int, bool] = manager.get_computed_blocks_for_connector(
                request, max_cache_hit_length
            )
            return found
        blocks, num_hit, junction = manager.get_computed_blocks(request, max_cache_hit_length)
        return blocks, num_hit, junction, False

    def _free_cow_retained_blocks(self, blocks: list[Any], fence_seq: int) -> None:
        """Return a copy-on-write's retained blocks to the pool, or queue them (tail first)
        behind ``fence_seq`` while the step running the copy may still be in flight."""
        if not self.defer_block_free or fence_seq <= self.processed_step_seq:  # type: ignore[attr-defined]
            self.kv_cache_manager.block_pool.free_blocks(blocks)  # type: ignore[attr-defined]
            return
        self.deferred_frees.append((fence_seq, blocks[::-1]))  # type: ignore[attr-defined]


from pagedkv.compat.vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
