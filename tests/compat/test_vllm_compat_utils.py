"""pagedkv.compat.vllm's kv_cache_utils and per-group managers: the free block queue view,
vLLM's live req_to_blocks lists, zeroing records and the capacity helpers."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from pagedkv.compat.vllm.config import VllmConfig
from pagedkv.compat.vllm.config.model import ModelConfig
from pagedkv.compat.vllm.config.speculative import SpeculativeConfig
from pagedkv.compat.vllm.v1.core.block_pool import BlockPool
from pagedkv.compat.vllm.v1.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    generate_scheduler_kv_cache_config,
    get_max_concurrency_for_kv_cache_config,
    make_block_hash_with_group_id,
)
from pagedkv.compat.vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from pagedkv.compat.vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)


def test_free_queue_links_follow_pagedkvs_order() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue([blocks[2], blocks[0], blocks[3]])
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    assert head.next_free_block is blocks[2] and blocks[2].prev_free_block is head
    assert blocks[0].next_free_block is blocks[3] and blocks[3].next_free_block is tail
    queue.remove(blocks[0])
    assert blocks[2].next_free_block is blocks[3] and blocks[0].next_free_block is None
    queue.prepend_n([blocks[1], blocks[0]])
    queue.append(KVCacheBlock(9))
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 0, 2, 3, 9]
    assert [b.block_id for b in queue.popleft_n(2)] == [1, 0]
    assert queue.num_free_blocks == 3 and blocks[1].prev_free_block is None
    with pytest.raises(ValueError, match="already in a free block queue"):
        queue.append(blocks[2])
    with pytest.raises(RuntimeError, match="invalid block"):
        queue.remove(blocks[1])
    queue.popleft_n(3)
    assert head.next_free_block is tail and tail.prev_free_block is head
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()


def test_vllm_mla_specs_pad_their_pages_to_the_alignment() -> None:
    mla = MLAAttentionSpec(
        block_size=128,
        num_kv_heads=1,
        head_size=584,
        dtype="uint8",
        tokens_per_state=2,
        alignment=576,
    )
    window = SlidingWindowMLASpec(
        block_size=32,
        num_kv_heads=1,
        head_size=584,
        dtype="uint8",
        sliding_window=128,
        alignment=576,
    )
    assert (mla.real_page_size_bytes, mla.page_size_bytes) == (37376, 37440)
    assert (window.real_page_size_bytes, window.page_size_bytes) == (18688, 19008)


def test_standalone_blocks_are_keyed_beside_the_pool_not_in_it() -> None:
    # vLLM's tests hash KVCacheBlock(i) objects built outside the pool, block id 0 among
    # them: the compat map keeps them; pagedkv's pool (and its null block) stays unkeyed.
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    request = SimpleNamespace(block_hashes=[b"h0", b"h1", b"h2"])
    blocks = [KVCacheBlock(0), KVCacheBlock(1)]
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    assert len(pool.cached_block_hash_to_block) == 2
    assert blocks[0].block_hash == make_block_hash_with_group_id(b"h0", 0)
    assert pool.get_cached_block(b"h1", [0]) == [blocks[1]]
    assert pool.impl.block_hash[:2] == [None, None] and pool.blocks[1].block_hash is None
    again = [KVCacheBlock(0), KVCacheBlock(1), KVCacheBlock(2)]
    pool.cache_full_blocks(request, again, 0, 3, 4, 1)  # the same ids, another group
    assert len(pool.cached_block_hash_to_block) == 5
    assert pool.get_cached_block(b"h1", [0, 1]) == [blocks[1], again[1]]
    with pytest.raises(ValueError, match="pass one kind"):
        pool.cache_full_blocks(request, [KVCacheBlock(1), pool.blocks[2]], 0, 2, 4, 2)
    assert pool.get_cached_block(b"h0", [2]) is None  # nothing keyed before the refusal
    assert pool.reset_prefix_cache() and len(pool.cached_block_hash_to_block) == 0
    assert pool.get_cached_block(b"h0", [0]) is None


def test_a_key_shared_by_two_blocks_stays_a_dict_until_it_empties() -> None:
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    key = make_block_hash_with_group_id(b"k", 7)
    null, block = pool.null_block, pool.blocks[3]
    for b in (null, block):
        b.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, b)
    assert pool.cached_block_hash_to_block._cache == {key: {0: null, 3: block}}
    assert pool.impl.block_hash[0] is None  # pagedkv's null block is never keyed
    assert pool._maybe_evict_cached_block(null) and null.block_hash is None
    assert pool.cached_block_hash_to_block._cache == {key: {3: block}}
    assert pool._maybe_evict_cached_block(block) and block.block_hash is None
    assert pool.cached_block_hash_to_block._cache == {}
    block.set_block_hash(key)
    pool.cached_block_hash_to_block.insert(key, block)
    assert pool.cached_block_hash_to_block._cache == {key: block}


@pytest.mark.parametrize("how", ["evict_blocks", "get_new_blocks"])
def test_a_key_emptied_by_eviction_starts_over_as_a_plain_block(how: str) -> None:
    pool = BlockPool(num_gpu_blocks=6, enable_caching=True, hash_block_size=16)
    blocks = pool.get_new_blocks(3)
    key = make_block_hash_with_group_id(b"x" * 32, 0)
    cached = pool.cached_block_hash_to_block
    for b in blocks[:2]:
        b.set_block_hash(key)
        cached.insert(key, b)
    assert isinstance(cached._cache[key], dict)
    pool.free_blocks(blocks[:2])
    if how == "evict_blocks":
        pool.evict_blocks([blocks[0].block_id, blocks[1].block_id])
    else:
        pool.get_new_blocks(pool.get_num_free_blocks())
    assert key not in cached._cache
    blocks[2].set_block_hash(key)
    cached.insert(key, blocks[2])
    assert cached._cache[key] is blocks[2]


def test_an_assigned_table_list_sees_the_managers_changes() -> None:
    spec = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=1, sliding_window=4)
    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=2)
    manager = SlidingWindowManager(spec, block_pool=pool, needs_kv_cache_zeroing=True)
    table = pool.get_new_blocks(4)
    manager.req_to_blocks["r"] = table
    manager.remove_skipped_blocks("r", 7)  # tokens 0-3 left the window: blocks 0 and 1
    assert table[:2] == [pool.null_block, pool.null_block] and manager.req_to_blocks["r"] is table
    new = manager.allocate_new_blocks("r", 10, 10)
    assert table[4:] == new and manager.take_new_block_ids() == [b.block_id for b in new]
    assert manager.pop_blocks_for_free("r") == table[2:]


def test_scheduler_config_and_concurrency_agree_for_uniform_groups() -> None:
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="float16")
    window = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="float16", sliding_window=64
    )
    uniform = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full, "b": full})
    config = KVCacheConfig(
        num_blocks=400,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["a", "b"], uniform), KVCacheGroupSpec(["c"], window)],
    )
    scheduler = generate_scheduler_kv_cache_config([config])
    assert scheduler.kv_cache_groups[0].kv_cache_spec == full
    assert config.kv_cache_groups[0].kv_cache_spec is uniform  # the workers' stays
    vllm = VllmConfig(model_config=ModelConfig("m", max_model_len=1024))
    # full attention: 1024 / 16 = 64 blocks; the window: cdiv(63 + 1024, 16) + 1 = 65
    expected = 400 / (64 + 65)
    assert get_max_concurrency_for_kv_cache_config(vllm, config) == pytest.approx(expected)
    assert get_max_concurrency_for_kv_cache_config(vllm, scheduler) == pytest.approx(expected)
    with pytest.raises(AssertionError, match="num_blocks"):
        generate_scheduler_kv_cache_config([config, dataclasses.replace(config, num_blocks=1)])


@pytest.mark.parametrize(
    ("method", "fields", "expected"),
    [
        ("eagle", {}, 1),
        ("mtp", {"disable_lookahead_block_hashes": True}, 0),
        ("mtp", {"disable_eagle_block_drop": True}, 0),
        ("dflash", {}, 0),
    ],
)
def test_hash_lookahead_follows_the_drafter(method: str, fields: dict, expected: int) -> None:
    spec = SpeculativeConfig(method=method, num_speculative_tokens=3, **fields)
    assert VllmConfig(speculative_config=spec).num_hash_lookahead_tokens == expected
    no_cache = VllmConfig(speculative_config=spec)
    no_cache.cache_config.enable_prefix_caching = False
    assert no_cache.num_hash_lookahead_tokens == 0


def test_spec_memory_reads_a_vllm_shaped_namespace_config() -> None:
    torch = pytest.importorskip("torch")
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16)
    config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=1024),
        cache_config=SimpleNamespace(block_size=16),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )
    # 64 blocks of 16 tokens x (K and V) x 64 fp16 elements
    assert spec.max_memory_usage_bytes(config) == 64 * 16 * 2 * 64 * 2


@pytest.mark.parametrize(
    ("parallel_drafting", "use_v2", "expected"),
    [(False, False, 4), (True, False, 7), (True, True, 4)],
)
def test_hisparse_decode_width_counts_v1_parallel_drafting_slots(
    parallel_drafting: bool, use_v2: bool, expected: int
) -> None:
    from pagedkv.compat.vllm.v1.hisparse.layout import _max_decode_query_len

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            num_speculative_tokens=3, parallel_drafting=parallel_drafting
        ),
        use_v2_model_runner=use_v2,
    )
    assert _max_decode_query_len(config) == expected
    assert _max_decode_query_len(SimpleNamespace(speculative_config=None)) == 1


def _mamba_checkpoint_spec() -> Any:
    from pagedkv import MambaSpec

    return MambaSpec(
        block_size=16,
        shapes=((4, 4),),
        dtypes=("bfloat16",),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=1,
    )


def test_mamba_manager_skips_the_checkpoint_before_the_prefill_end() -> None:
    from pagedkv.compat.vllm.v1.core.single_type_kv_cache_manager import MambaManager

    manager = MambaManager(
        _mamba_checkpoint_spec(),
        BlockPool(20, True, 16),
        max_model_len=256,
        max_in_flight_tokens=256,
    )
    # a 40-token chunk: the running state, plus a checkpoint block at 32 unless the
    # prefill ends past the chunk (the plan for a skipped checkpoint is dropped)
    assert manager.get_num_blocks_to_allocate("a", 40, [], 0, prefill_end=0) == 2
    assert manager.get_num_blocks_to_allocate("a", 40, [], 0, prefill_end=100) == 1
    assert "a" not in manager.impl._checkpoints


@pytest.mark.parametrize(("interval", "expected"), [(0, 3 + 1), (16, 3 + 2), (None, 3 + 2)])
def test_coordinator_reads_prefill_end_only_under_interval_0(
    interval: int | None, expected: int
) -> None:
    from pagedkv import EngineConfig
    from pagedkv import FullAttentionSpec as CoreFull
    from pagedkv import KVCacheConfig as CoreConfig
    from pagedkv import KVCacheGroupSpec as CoreGroup
    from pagedkv import KVCacheManager as CoreManager
    from pagedkv.compat.vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    specs = (CoreFull(block_size=16, num_kv_heads=1, head_size=8), _mamba_checkpoint_spec())
    config = CoreConfig(
        num_blocks=30,
        kv_cache_tensors=(),
        kv_cache_groups=tuple(
            CoreGroup(layer_names=(f"layer{i}",), kv_cache_spec=s) for i, s in enumerate(specs)
        ),
        max_model_len=256,
    )
    core = CoreManager(
        config,
        EngineConfig.create(max_model_len=256, max_num_batched_tokens=64),
        prefix_cache_retention_interval=interval,
    )
    pool = BlockPool(0, False, 0, impl=core.block_pool)
    coordinator = HybridKVCacheCoordinator(core.coordinator, pool, config, 16, interval)
    needed = coordinator.get_num_blocks_to_allocate("a", 40, ((), ()), 0, 0, 0, 40, prefill_end=100)
    assert needed == expected


def test_hisparse_host_group_counts_like_vllms_source_manager() -> None:
    """0 while the host pool backs the pages, else one past the GPU pool (no fit)."""
    torch = pytest.importorskip("torch")
    from pagedkv.compat.vllm.v1.core.kv_cache_manager import KVCacheManager
    from pagedkv.compat.vllm.v1.hisparse.coordinator import get_hisparse_coordinator
    from pagedkv.compat.vllm.v1.kv_cache_interface import (
        HiSparseHotSpec,
        HiSparseResidentSpec,
        KVCacheGroupRole,
    )

    source = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    off = {"enable_kv_transfer": False}
    groups = [
        KVCacheGroupSpec(
            ["source"], source, role=KVCacheGroupRole.HISPARSE_SOURCE, host_resident=True
        ),
        KVCacheGroupSpec(["indexer"], source, role=KVCacheGroupRole.HISPARSE_INDEXER, **off),
        KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=16, page_size=64), **off),
        KVCacheGroupSpec(
            ["hot"], HiSparseHotSpec(block_size=16, page_size=64, blocks_per_request=2), **off
        ),
    ]
    config = KVCacheConfig(
        num_blocks=32, hisparse_host_num_blocks=4, kv_cache_tensors=[], kv_cache_groups=groups
    )
    manager = KVCacheManager(
        config, max_model_len=128, scheduler_block_size=16, enable_caching=False
    )
    coordinator = get_hisparse_coordinator(manager)
    assert coordinator.get_host_block_pool().get_num_free_blocks() == 3
    counts = [
        coordinator.host_manager.get_num_blocks_to_allocate("r", n, [], 0, 0, n)
        for n in (16, 48, 64)
    ]
    assert counts == [0, 0, 32 + 1]
