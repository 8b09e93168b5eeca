"""The Mamba "align" chunk split's options beyond the defaults, on hand-worked cases.

The defaults are covered case by case in tests/sim/test_chunking.py (the simulator calls
the same function); here each option of ``MambaChunkRule`` moves a chunk end that a
reader can check on paper.
"""

from __future__ import annotations

import pytest

from pagedkv.errors import ConfigError
from pagedkv.specs.mamba_chunking import MambaChunkRule, mamba_chunk_tokens


def _split(rule: MambaChunkRule, start: int, num_new: int, prompt: int, junction: int = 0) -> int:
    return mamba_chunk_tokens(
        rule,
        start=start,
        num_new_tokens=num_new,
        num_prompt_tokens=prompt,
        num_tokens=prompt,
        junction=junction,
    )


def test_partial_hits_add_a_stop_at_the_prompts_last_hash_boundary():
    # block 512, hash 32, prompt 10000: the last block stop is 9728 (9999 // 512 * 512),
    # then the prompt's last hash boundary 9984 (9999 // 32 * 32), then the rest.
    rule = MambaChunkRule(512, 32, 8192, partial_hits=True)
    assert _split(rule, 0, 8192, 10000) == 8192
    assert _split(rule, 8192, 1808, 10000) == 1536
    assert _split(rule, 9728, 272, 10000) == 256
    assert _split(rule, 9984, 16, 10000) == 16
    # without partial hits the tail runs in one chunk
    assert _split(MambaChunkRule(512, 32, 8192), 9728, 272, 10000) == 272


def test_eagle_block_drop_moves_the_tail_stop_one_hash_unit_down():
    # prompt 24576, hash 128, block 1536: the EAGLE drop backs off one unit, 24448
    eagle = MambaChunkRule(1536, 128, 8192, partial_hits=True, drop_eagle_block=True)
    assert _split(eagle, 23040, 1536, 24576) == 24448 - 23040
    plain = MambaChunkRule(1536, 128, 8192, partial_hits=True)
    assert _split(plain, 23040, 1537, 24577) == 24576 - 23040


def test_internal_checkpoint_lets_the_final_chunk_run_whole():
    # block 16, hash 16, prompt 100, final chunk 0..100: the kernel writes the checkpoint
    # at 96 itself (aligned 16 from the start), so no stop at 96 is needed.
    rule = MambaChunkRule(16, 16, 8192, internal_checkpoints=True, checkpoint_alignment=16)
    assert _split(rule, 0, 100, 100) == 100
    # misaligned (alignment 64 does not divide 96): the usual stop at 96 comes back
    misaligned = MambaChunkRule(16, 16, 8192, internal_checkpoints=True, checkpoint_alignment=64)
    assert _split(misaligned, 0, 100, 100) == 96


def test_shared_prefix_checkpoint_stops_exactly_at_the_junction():
    # junction 40 inside 0..64 of a 100-token prompt, block 16: floored to 32 by default
    assert _split(MambaChunkRule(16, 8, 2048), 0, 64, 100, junction=40) == 32
    exact = MambaChunkRule(16, 8, 2048, shared_prefix_checkpoint=True)
    assert _split(exact, 0, 64, 100, junction=40) == 40


def test_block_wider_than_the_chunk_limit_advances_sub_block():
    # block 512, chunk limit 384: 0..384 runs unaligned, then re-aligns at 512
    rule = MambaChunkRule(512, 32, 384)
    assert _split(rule, 0, 384, 1300) == 384
    assert _split(rule, 384, 384, 1300) == 128


@pytest.mark.parametrize("field", ["block_size", "hash_block_size", "max_chunk_tokens"])
def test_bad_sizes_name_the_field(field):
    sizes = {"block_size": 16, "hash_block_size": 16, "max_chunk_tokens": 16, field: 0}
    with pytest.raises(ConfigError, match=field):
        MambaChunkRule(**sizes)
