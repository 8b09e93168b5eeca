"""The attention function's batched path (short chunks of several requests in one gather and
one call) computes what the one-request-at-a-time path computes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.hf.attention import (  # noqa: E402
    AttentionOptions,
    attend_request,
    attend_short_chunks,
)
from pagedkv.specs import FullAttentionSpec, SlidingWindowSpec  # noqa: E402
from pagedkv.tensors import (  # noqa: E402
    BlockTableError,
    LayerView,
    ScheduledRequest,
    build_attention_metadata,
    gather_kv,
    window_for_spec,
)

BLOCK = 4
KV_HEADS, HEADS, DIM = 2, 4, 8


def _view(spec: FullAttentionSpec | SlidingWindowSpec, num_blocks: int) -> LayerView:
    generator = torch.Generator().manual_seed(0)
    cache = torch.randn((num_blocks, 2, BLOCK, KV_HEADS, DIM), generator=generator)
    return LayerView("model.layers.0.self_attn", 0, spec, "NHD", (cache,))


chunk = st.tuples(st.integers(0, 40), st.integers(1, 6))  # (computed tokens, new tokens)


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(chunk, min_size=1, max_size=5),
    window=st.sampled_from([None, 5, 12]),
    softcap=st.sampled_from([None, 3.0]),
    sinks=st.booleans(),
)
@pytest.mark.slow
def test_short_chunks_together_equal_one_by_one(
    chunks: list[tuple[int, int]], window: int | None, softcap: float | None, sinks: bool
) -> None:
    spec: FullAttentionSpec | SlidingWindowSpec = (
        FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=DIM)
        if window is None
        else SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=DIM, sliding_window=window
        )
    )
    next_block = 1
    scheduled = []
    for computed, new in chunks:
        num_blocks = -(-(computed + new) // BLOCK)
        scheduled.append(
            ScheduledRequest(([*range(next_block, next_block + num_blocks)],), computed, new)
        )
        next_block += num_blocks
    view = _view(spec, next_block)
    (meta,) = build_attention_metadata(scheduled, [BLOCK])
    query = torch.randn((int(meta.query_start_loc[-1]), HEADS, DIM))
    options = AttentionOptions(DIM**-0.5, softcap, torch.randn(HEADS) if sinks else None)
    win = window_for_spec(spec)
    batched, rows = attend_short_chunks(query, view, meta, list(range(len(chunks))), win, options)
    starts = meta.query_start_loc.tolist()
    for i, (computed, new) in enumerate(chunks):
        q_pos = meta.positions[starts[i] : starts[i + 1]]
        k_pos = torch.arange(int(win.key_start(q_pos[:1])[0]), computed + new)
        key, value = gather_kv(view, meta.block_table[i], k_pos)
        alone = attend_request(
            query[starts[i] : starts[i + 1]], key, value, q_pos, k_pos, win, options
        )
        assert rows[i, :new].tolist() == list(range(starts[i], starts[i + 1]))
        assert bool((rows[i, new:] == -1).all())
        torch.testing.assert_close(batched[i, :new], alone, rtol=1e-5, atol=1e-6)


def test_metadata_refuses_a_position_past_the_blocks() -> None:
    past = ScheduledRequest(([3, 4],), num_computed_tokens=7, num_new_tokens=2)
    with pytest.raises(BlockTableError, match="position 8 is past the 2 allocated blocks"):
        build_attention_metadata([past], [BLOCK])
