"""Where a prefill chunk must end so Mamba "align" states land on cacheable positions.

A Mamba state can be cached only where a chunk ends, so a scheduler in "align" mode clips
each prefill chunk. This is the one home of that rule: the simulator's scheduler, the
tensors layer's workload driver and ``pagedkv.compat.vllm``'s ``Scheduler`` all call
``mamba_chunk_tokens``. With the ``MambaChunkRule`` defaults it is vLLM 0.33's
``Scheduler._mamba_block_aligned_split`` for a model without EAGLE, hash lookahead,
partial (sub-block) hits or internal prefill checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.specs.mamba import prefill_checkpoint_exportable, prefill_checkpoint_position

__all__ = ["MambaChunkRule", "mamba_chunk_tokens"]


@dataclass(frozen=True)
class MambaChunkRule:
    """The scheduler settings the chunk split depends on.

    ``block_size``: the Mamba (cache) block size in tokens. ``hash_block_size``: the
    prefix-cache hash unit. ``max_chunk_tokens``: the most tokens one request may take in
    a step (token budget, capped by a long-prefill threshold). ``partial_hits``: sub-block
    prefix hits are on, so the prompt's last hash boundary is a stop of its own.
    ``coarse_block_size``: the scheduler block size (all groups' common multiple) used for
    the checkpoint position when partial hits are off (0: ``block_size``).
    ``drop_eagle_block``: EAGLE drops the last matched hash unit, so checkpoints back off
    one unit. ``num_hash_lookahead_tokens``: tokens that must follow a checkpoint.
    ``internal_checkpoints`` and ``checkpoint_alignment``: the kernel can write the
    prompt's checkpoint inside the final chunk (every Mamba group has prefill checkpoint
    blocks), at positions ``checkpoint_alignment`` tokens apart from the chunk start.
    ``shared_prefix_checkpoint``: stop exactly at a shared-prefix junction instead of
    flooring it to whole blocks (valid only inside the prompt).
    """

    block_size: int
    hash_block_size: int
    max_chunk_tokens: int
    partial_hits: bool = False
    coarse_block_size: int = 0
    drop_eagle_block: bool = False
    num_hash_lookahead_tokens: int = 0
    internal_checkpoints: bool = False
    checkpoint_alignment: int | None = None
    shared_prefix_checkpoint: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "hash_block_size", "max_chunk_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"MambaChunkRule.{name} must be an int >= 1, got {value!r}")

    def _checkpoint(self, num_tokens: int, unit: int) -> int:
        return prefill_checkpoint_position(
            num_tokens, unit, self.drop_eagle_block, self.num_hash_lookahead_tokens
        )

    def _uses_internal_checkpoint(self, start: int, end: int, prefill_end: int) -> bool:
        """Whether the final chunk ``[start, end)`` writes the prompt's checkpoint itself."""
        if not self.internal_checkpoints or end < prefill_end:
            return False
        unit = self.hash_block_size if self.partial_hits else self.coarse_block_size
        return prefill_checkpoint_exportable(
            start,
            end,
            self._checkpoint(prefill_end, unit or self.block_size),
            self.hash_block_size,
            self.block_size,
            self.checkpoint_alignment,
        )


def mamba_chunk_tokens(
    rule: MambaChunkRule,
    *,
    start: int,
    num_new_tokens: int,
    num_prompt_tokens: int,
    num_tokens: int,
    junction: int = 0,
) -> int:
    """How many of ``num_new_tokens`` (from position ``start``) a prefill chunk may take.

    A chunk that does not finish the prefill ends on a block boundary (unless a block is
    wider than ``max_chunk_tokens`` and no boundary lies inside it, so it still advances).
    Then the earliest of these stops strictly inside the chunk wins: the next boundary for
    a chunk starting mid-block, the sequence's last cacheable block position, the prompt's
    last hash boundary (with partial hits) and the shared-prefix ``junction``. Decode
    chunks (``start`` at or past the prefill end, which counts replayed outputs of a
    resumed request) are left alone. The result may be 0: nothing this step.

    Args:
        rule: the group's chunking rule (block sizes, chunk cap, partial hits, shared-prefix
            checkpoint).
        start: position of the chunk's first token.
        num_new_tokens: tokens the scheduler offers this step.
        num_prompt_tokens: tokens in the prompt.
        num_tokens: tokens in the sequence so far (prompt plus outputs, replayed ones included).
        junction: token position where a shared prefix ends (0: none).
    """
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    block = rule.block_size
    end = start + num_new_tokens
    internal = rule._uses_internal_checkpoint(start, end, prefill_end)
    last_cacheable = 0 if internal else rule._checkpoint(num_tokens, block)
    if end < prefill_end:
        aligned = end // block * block
        if aligned > start or block <= rule.max_chunk_tokens:
            end = aligned
    tail = 0
    if rule.partial_hits and not internal:
        tail = rule._checkpoint(num_prompt_tokens, rule.hash_block_size)
    floored = start + (junction - start) // block * block
    exact = rule.shared_prefix_checkpoint and junction <= num_prompt_tokens
    stops = (
        (start // block + 1) * block if start % block and not internal else 0,
        last_cacheable,
        tail if last_cacheable < tail < num_prompt_tokens else 0,
        (junction if exact else floored) if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
