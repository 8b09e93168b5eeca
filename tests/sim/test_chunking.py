"""vLLM 0.33's Mamba block-aligned chunk split, on cases worked out by hand.

Each case is (start = computed + hit, tokens asked, prompt length, sequence length,
shared-prefix junction, block size, max tokens per chunk) -> tokens scheduled. The same
function was compared with vLLM's ``Scheduler._mamba_block_aligned_split`` on 300,000
random cases (identical); these are the ones a reader can check on paper.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pagedkv.sim.scheduling.chunking import aligned_chunk, last_checkpoint_position

CASES = [
    # decode (past the prefill): untouched
    ((100, 1, 100, 101, 0, 16, 2048), 1),
    # a chunk short of the prefill end ends on a boundary: 0..40 -> 0..32
    ((0, 40, 100, 100, 0, 16, 2048), 32),
    # the last chunk stops at the last checkpoint 96 (99 // 16 * 16), then 96..100
    ((32, 68, 100, 100, 0, 16, 2048), 64),
    ((96, 4, 100, 100, 0, 16, 2048), 4),
    # a prompt of whole blocks: the final block is computed on its own (31 // 16 * 16 = 16)
    ((0, 32, 32, 32, 0, 16, 2048), 16),
    # started mid-block: stop at the next boundary (32), not at the aligned end 48
    ((20, 30, 100, 100, 0, 16, 2048), 12),
    # a block wider than a chunk: no boundary inside 0..64 -> runs on unaligned ...
    ((0, 64, 200, 200, 0, 80, 64), 64),
    # ... and re-aligns at the next boundary (80)
    ((64, 64, 200, 200, 0, 80, 64), 16),
    # a block no wider than a chunk, no boundary inside: nothing scheduled this step
    ((0, 10, 100, 100, 0, 16, 2048), 0),
    # the shared-prefix junction at 40, floored to whole blocks from the start: 32
    ((0, 64, 100, 100, 40, 16, 2048), 32),
    # the junction floored from a mid-block start (20 + 25 // 16 * 16 = 36) loses to the
    # next boundary 32
    ((20, 40, 100, 100, 45, 16, 2048), 12),
    # a junction at or before the start is ignored
    ((32, 64, 200, 200, 32, 16, 2048), 64),
    # a preempted request replays its outputs: prompt 30 + 10 outputs, prefill end 39,
    # last checkpoint 32
    ((0, 40, 30, 40, 0, 16, 2048), 32),
    ((32, 8, 30, 40, 0, 16, 2048), 8),
]


@pytest.mark.parametrize(("case", "expected"), CASES)
def test_aligned_chunk_hand_worked(case, expected):
    start, num_new, num_prompt, num_tokens, junction, block, max_chunk = case
    req = SimpleNamespace(
        num_computed_tokens=start,
        num_prompt_tokens=num_prompt,
        num_tokens=num_tokens,
        shared_prefix_boundary=junction,
    )
    assert aligned_chunk(req, num_new, 0, block, max_chunk) == expected
    # the same start reached through a cache hit instead of computed tokens
    req.num_computed_tokens = 0
    assert aligned_chunk(req, num_new, start, block, max_chunk) == expected


def test_last_checkpoint_position():
    assert [last_checkpoint_position(n, 16) for n in (1, 16, 17, 32, 33)] == [0, 0, 16, 16, 32]
