"""Page sizes and merges of the ring, R-SWA, compressed / aligned MLA and HiSparse kinds,
for any shape (vLLM 0.33's formulas)."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from pagedkv import (
    CircularBufferSpec,
    EngineConfig,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
)
from pagedkv.dtypes import get_kv_dtype
from pagedkv.errors import KVCacheSpecError

CONFIG = EngineConfig.create(max_model_len=4096, max_num_batched_tokens=512)
DTYPES = st.sampled_from(["bfloat16", "float16", "float32", "fp8"])
powers = st.integers(0, 8).map(lambda n: 1 << n)


@given(block=st.integers(1, 256), heads=st.integers(1, 8), head=st.integers(1, 1024), dtype=DTYPES)
def test_ring_page_is_one_block_of_keys_held_for_the_whole_request(
    block: int, heads: int, head: int, dtype: str
) -> None:
    spec = CircularBufferSpec(
        block_size=block, num_kv_heads=heads, head_size=head, head_size_v=0, dtype=dtype
    )
    assert spec.page_size_bytes == block * heads * get_kv_dtype(dtype).bytes_per_vector(head)
    assert spec.max_memory_usage_bytes(CONFIG) == spec.page_size_bytes
    assert spec.max_num_blocks_per_req(CONFIG) == 1
    assert not spec.prefix_cacheable and not spec.disables_prefix_caching


@given(states=st.integers(1, 64), ratio=powers, head=st.integers(1, 1024))
def test_compressed_page_holds_one_state_per_ratio_tokens(
    states: int, ratio: int, head: int
) -> None:
    compressed = MLAAttentionSpec(block_size=states * ratio, head_size=head, tokens_per_state=ratio)
    plain = MLAAttentionSpec(block_size=states, head_size=head)
    assert compressed.page_size_bytes == plain.page_size_bytes == states * head * 2


@given(block=st.integers(1, 128), head=st.integers(1, 1024), alignment=st.integers(1, 4096))
def test_alignment_pads_the_page_up_to_the_next_multiple(
    block: int, head: int, alignment: int
) -> None:
    for cls, extra in ((MLAAttentionSpec, {}), (SlidingWindowMLASpec, {"sliding_window": 64})):
        spec = cls(block_size=block, head_size=head, alignment=alignment, **extra)
        real = block * head * 2
        assert spec.real_page_size_bytes == real
        assert spec.page_size_bytes % alignment == 0
        assert 0 <= spec.page_size_bytes - real < alignment


@given(window=st.integers(1, 512), other=st.integers(1, 512))
def test_rswa_layers_merge_only_with_one_window(window: int, other: int) -> None:
    spec = RSWASpec(block_size=16, num_kv_heads=2, head_size=64, rswa_window=window)
    assert RSWASpec.merge([spec, spec]) == spec
    changed = dataclasses.replace(spec, rswa_window=other)
    if other != window:
        try:
            RSWASpec.merge([spec, changed])
        except KVCacheSpecError as exc:
            assert "rswa_window" in str(exc)
        else:
            raise AssertionError("R-SWA layers with different windows merged")
    assert spec.page_size_bytes == 16 * 2 * 2 * 64 * 2  # sized as full attention
    assert spec.max_memory_usage_bytes(CONFIG) == 256 * spec.page_size_bytes


@given(block=st.integers(1, 256), page=st.integers(1, 1 << 20), per_request=st.integers(1, 64))
def test_hisparse_pages_are_given_in_bytes(block: int, page: int, per_request: int) -> None:
    hot = HiSparseHotSpec(block_size=block, page_size=page, blocks_per_request=per_request)
    resident = HiSparseResidentSpec(block_size=block, page_size=page)
    for spec in (hot, resident, hot.copy_with_new_block_size(2 * block)):
        assert spec.page_size_bytes == page
        assert not spec.prefix_cacheable and not spec.disables_prefix_caching
    assert hot.max_memory_usage_bytes(CONFIG) == per_request * page
    assert hot.max_num_blocks_per_req(CONFIG) == per_request
    assert resident.max_memory_usage_bytes(CONFIG) == -(-512 // block) * page


@given(window=st.integers(1, 512), replay=st.booleans())
def test_sliding_mla_uniformity_needs_window_and_replay_policy(window: int, replay: bool) -> None:
    spec = SlidingWindowMLASpec(block_size=16, head_size=576, sliding_window=128)
    other = SlidingWindowMLASpec(
        block_size=16, head_size=576, sliding_window=window, bounded_replay=replay
    )
    expected = window == 128 and not replay
    assert spec.is_uniform_with_collection({"a": spec, "b": other}) is expected
    assert other.prefix_cacheable is (not replay)
    assert other.prefix_replay_tokens == (window if replay else 0)
    assert spec.prefix_replay_tokens == 0
    packed = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": spec, "b": other})
    assert packed.prefix_replay_tokens == (window if replay else 0)
