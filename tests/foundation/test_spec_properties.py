"""Hypothesis: size and lifetime invariants of single specs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.config import EngineConfig
from pagedkv.dtypes import DTYPES, get_kv_dtype
from pagedkv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

SETTINGS = settings(max_examples=100, deadline=None)

block_sizes = st.integers(1, 256)
lengths = st.integers(1, 1 << 20)
dtype_names = st.sampled_from(sorted(DTYPES))


@SETTINGS
@given(dtype_names, st.integers(0, 4096))
def test_vector_bytes_cover_the_bits_and_only_add_scales(name: str, num_elements: int) -> None:
    fmt = get_kv_dtype(name)
    data = -(-num_elements * fmt.bits // 8)
    size = fmt.bytes_per_vector(num_elements)
    assert size >= data
    if not fmt.scale_bytes or num_elements == 0:
        assert size == data
    else:
        assert size - data >= fmt.scale_bytes


@SETTINGS
@given(
    block_sizes,
    st.integers(1, 64),
    st.sampled_from([64, 80, 128, 256]),
    dtype_names,
    st.integers(1, 8),
)
def test_attention_page_is_linear_in_block_size(
    block_size: int, heads: int, head_size: int, dtype: str, factor: int
) -> None:
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype
    )
    assert spec.page_size_bytes == block_size * spec.bytes_per_token
    bigger = spec.copy_with_new_block_size(block_size * factor)
    assert bigger.page_size_bytes == factor * spec.page_size_bytes
    # Scales make quantized pages strictly bigger than the bare bits.
    bare = block_size * heads * 2 * head_size * get_kv_dtype(dtype).bits // 8
    assert spec.page_size_bytes >= bare
    assert (spec.page_size_bytes > bare) == bool(get_kv_dtype(dtype).scale_bytes)


@SETTINGS
@given(block_sizes, lengths)
def test_block_table_row_covers_the_request(block_size: int, max_model_len: int) -> None:
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64)
    config = EngineConfig.create(max_model_len=max_model_len)
    blocks = spec.max_num_blocks_per_req(config)
    assert (blocks - 1) * block_size < max_model_len <= blocks * block_size
    assert spec.max_memory_usage_bytes(config) == blocks * spec.page_size_bytes


@SETTINGS
@given(block_sizes, st.integers(1, 1 << 16), st.integers(0, 1 << 16), lengths, st.integers(0, 64))
def test_local_admission_is_bounded_and_monotone(
    block_size: int, window: int, in_flight: int, max_model_len: int, more: int
) -> None:
    sw = SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=64, sliding_window=window
    )
    chunk = ChunkedLocalAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=64, attention_chunk_size=window
    )
    full_row = -(-max_model_len // block_size)
    for spec, extra in ((sw, 1), (chunk, 0)):
        blocks = spec.max_admission_blocks_per_request(in_flight, max_model_len)
        assert 1 <= blocks <= full_row + extra
        assert spec.max_admission_blocks_per_request(in_flight + more, max_model_len) >= blocks
        assert spec.max_admission_blocks_per_request(in_flight, max_model_len + more) >= blocks
