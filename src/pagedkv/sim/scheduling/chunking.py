"""How many tokens of a request's prefill one step may take (the chunk split)."""

from __future__ import annotations

from typing import Any

from pagedkv.specs.mamba import prefill_checkpoint_position
from pagedkv.specs.mamba_chunking import MambaChunkRule, mamba_chunk_tokens

__all__ = [
    "last_checkpoint_position",
    "aligned_chunk",
]


def last_checkpoint_position(num_tokens: int, block_size: int) -> int:
    """The last block boundary before a sequence's final token: the prompt's last Mamba
    state worth caching (the final token is always computed again for its logits)."""
    return prefill_checkpoint_position(num_tokens, block_size)


def aligned_chunk(
    req: Any, num_new: int, num_hit: int, block_size: int, max_chunk_tokens: int
) -> int:
    """Mamba checkpoint ("align") mode: where vLLM 0.33's scheduler ends a prefill chunk
    with its defaults (no EAGLE, no lookahead tokens, no partial hits, no prefill-checkpoint
    blocks), since a Mamba state can be cached only where a chunk ends. The rule itself is
    ``pagedkv.specs.mamba_chunking.mamba_chunk_tokens``; ``max_chunk_tokens`` is the most
    one step may take (``min`` of the token budget and the chunk limit).

    Args:
        req: the request (computed, prompt and total tokens, shared-prefix boundary).
        num_new: tokens the budget offers this step.
        num_hit: prefix-cache hit tokens this step adds before the chunk.
        block_size: tokens per Mamba block (the checkpoint step).
        max_chunk_tokens: the most tokens one step may take.
    """
    rule = MambaChunkRule(block_size, block_size, max_chunk_tokens)
    return mamba_chunk_tokens(
        rule,
        start=req.num_computed_tokens + num_hit,
        num_new_tokens=num_new,
        num_prompt_tokens=req.num_prompt_tokens,
        num_tokens=req.num_tokens,
        junction=getattr(req, "shared_prefix_boundary", 0),
    )
