"""How many tokens of a request's prefill one step may take (the chunk split)."""

from __future__ import annotations

from typing import Any


def last_checkpoint_position(num_tokens: int, block_size: int) -> int:
    """The last block boundary before a sequence's final token: the prompt's last Mamba
    state worth caching (the final token is always computed again for its logits)."""
    return max((num_tokens - 1) // block_size * block_size, 0)


def aligned_chunk(
    req: Any, num_new: int, num_hit: int, block_size: int, max_chunk_tokens: int
) -> int:
    """Mamba checkpoint ("align") mode: where vLLM 0.33's scheduler ends a prefill chunk
    (``Scheduler._mamba_block_aligned_split`` with its defaults: no EAGLE, no lookahead
    tokens, no prefill-checkpoint blocks), since a Mamba state can be cached only where a
    chunk ends.

    A chunk that does not finish the prefill ends on a block boundary; then, of these
    stops, the earliest strictly inside the chunk wins: the next boundary (for a chunk
    starting mid-block), the last checkpoint (``last_checkpoint_position``) and the
    shared-prefix junction the lookup found, floored to whole blocks from the start.
    ``max_chunk_tokens`` is the most one step may take (``min`` of the token budget and
    the chunk limit): when a block is larger and no boundary lies inside the chunk, it
    stays unaligned so the prefill still advances. Decode chunks are left alone.
    """
    start = req.num_computed_tokens + num_hit
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
    if start >= prefill_end:
        return num_new
    end = start + num_new
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_chunk_tokens:
            end = aligned
    junction = getattr(req, "shared_prefix_boundary", 0)
    stops = (
        (start // block_size + 1) * block_size if start % block_size else 0,
        last_checkpoint_position(req.num_tokens, block_size),
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
