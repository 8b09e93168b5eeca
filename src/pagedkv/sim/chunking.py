"""How many tokens of a request's prefill one step may take (the chunk split)."""

from __future__ import annotations

from typing import Any


def aligned_chunk(
    req: Any, num_new: int, num_hit: int, block_size: int, max_chunk_tokens: int
) -> int:
    """Mamba checkpoint ("align") mode: a prefill chunk that does not finish the prefill
    ends on a block boundary, and one starting mid-block stops at the next boundary or at
    the shared-prefix junction (vLLM's block-aligned split, without prefill checkpoints).

    ``max_chunk_tokens`` is the most one step may take (``min`` of the token budget and
    the chunk limit): when a block is larger, an unaligned chunk is kept so the prefill
    still advances.
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
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
