"""pagedkv.compat.vllm: vLLM's names translate onto pagedkv's own runtime and registry."""

from __future__ import annotations

from dataclasses import dataclass, replace
from unittest.mock import patch

import pytest

from pagedkv.compat.vllm._outside import OutsideKVCacheLayerError
from pagedkv.compat.vllm.sampling_params import SamplingParams
from pagedkv.compat.vllm.utils.hashing import sha256
from pagedkv.compat.vllm.v1.core import kv_cache_utils
from pagedkv.compat.vllm.v1.core.block_pool import BlockPool
from pagedkv.compat.vllm.v1.core.kv_cache_manager import KVCacheManager
from pagedkv.compat.vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from pagedkv.compat.vllm.v1.core.sched.scheduler import Scheduler
from pagedkv.compat.vllm.v1.core.single_type_kv_cache_manager import (
    FullAttentionManager,
    SlidingWindowManager,
)
from pagedkv.compat.vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpecKind,
    MLAAttentionSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
)
from pagedkv.compat.vllm.v1.kv_cache_spec_registry import (
    KVCacheSpecRegistry,
    register_kv_cache_spec,
)
from pagedkv.compat.vllm.v1.request import Request
from pagedkv.errors import KVCacheSpecError
from pagedkv.registry import KVCacheSpecRegistry as CoreRegistry
from pagedkv.runtime import managers as core_managers

BLOCK = 4


def full_spec(**fields: object) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype="float32", **fields
    )


def manager(num_blocks: int = 10) -> KVCacheManager:
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], full_spec())],
    )
    return KVCacheManager(
        config, max_model_len=64, scheduler_block_size=BLOCK, hash_block_size=BLOCK
    )


def request(request_id: str, tokens: list[int]) -> Request:
    kv_cache_utils.init_none_hash(sha256)
    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256),
    )


def test_hits_allocations_and_frees_come_from_pagedkv_in_block_objects() -> None:
    kv = manager()
    first = request("a", list(range(10)))
    blocks, num_hit, _ = kv.get_computed_blocks(first)
    assert num_hit == 0
    new = kv.allocate_slots(first, 10, num_hit, blocks)
    assert new is not None and new.get_block_ids() == ([1, 2, 3],)
    assert new.get_block_ids() == kv.impl.get_block_ids("a")  # pagedkv's own table
    pool = kv.block_pool
    assert [b.ref_cnt for b in new.blocks[0]] == [1, 1, 1]
    # The two full blocks are cached under vLLM's key: hash then 4-byte group id.
    key = pool.blocks[1].block_hash
    assert key is not None and kv_cache_utils.get_group_id(key) == 0
    assert kv_cache_utils.get_block_hash(key) == first.block_hashes[0]
    assert pool.blocks[3].block_hash is None

    second = request("b", [*list(range(8)), 99, 98])
    hit_blocks, num_hit, _ = kv.get_computed_blocks(second)
    assert num_hit == 8 and hit_blocks.get_block_ids() == ([1, 2],)
    assert kv.allocate_slots(second, 2, num_hit, hit_blocks) is not None
    assert pool.blocks[1].ref_cnt == 2

    kv.free(first)
    kv.free(second)
    assert pool.get_num_free_blocks() == 9
    assert pool.blocks[1].ref_cnt == 0 and pool.blocks[1].block_hash == key


def test_block_pool_wraps_pagedkv_pool() -> None:
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=BLOCK)
    got = pool.get_new_blocks(2)
    assert [b.block_id for b in got] == [1, 2]
    assert pool.impl.ref_cnt[1] == 1 and got[0].ref_cnt == 1
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    pool.free_blocks(got)
    assert pool.get_num_free_blocks() == 4
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [
        b for b in pool.impl.queue.order()
    ]
    with pytest.raises(ValueError, match="Cannot get 9 free blocks"):
        pool.get_new_blocks(9)


def test_standalone_manager_wraps_pagedkv_manager_of_its_kind() -> None:
    pool = BlockPool(num_gpu_blocks=8, enable_caching=False, hash_block_size=BLOCK)
    swa = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype="float32", sliding_window=4
    )
    m = SlidingWindowManager(swa, block_pool=pool, enable_caching=False, kv_cache_group_id=0)
    assert isinstance(m.impl, core_managers.SlidingWindowManager)
    assert [b.block_id for b in m.allocate_new_blocks("r", 12, 12)] == [1, 2, 3]
    m.remove_skipped_blocks("r", 12)
    assert m.req_to_blocks["r"][0] is pool.null_block  # pagedkv nulled what fell out
    m.free("r")
    assert pool.get_num_free_blocks() == 7


def test_registry_answers_vllm_names_and_registers_with_pagedkv() -> None:
    assert KVCacheSpecRegistry.get_manager_class(full_spec()) is FullAttentionManager
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype="float32")
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(mla) is FullAttentionSpec

    @register_kv_cache_spec(manager_class=FullAttentionManager)
    @dataclass(frozen=True, kw_only=True)
    class PluginSpec(FullAttentionSpec):
        extra: int = 1

    spec = PluginSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype="float32")
    assert KVCacheSpecRegistry.get_manager_class(spec) is FullAttentionManager
    assert CoreRegistry.get_manager_class(spec) is core_managers.FullAttentionManager
    with pytest.raises(AssertionError, match="manager_class is required"):
        KVCacheSpecRegistry.register(PluginSpec)


def test_spec_fields_pagedkv_lacks_are_kept_or_refused() -> None:
    spec = full_spec(non_causal=True, dcp_sharded=False)
    assert spec.non_causal is True and spec.page_size_bytes == BLOCK * 2 * 4
    assert replace(spec, block_size=8).non_causal is True
    assert get_kv_cache_spec_kind(spec) is KVCacheSpecKind.FULL_ATTENTION
    with pytest.raises(KVCacheSpecError, match="num_head_slots"):
        full_spec(num_head_slots=3)


def test_features_outside_the_layer_are_named() -> None:
    with pytest.raises(OutsideKVCacheLayerError, match="scheduler"):
        Scheduler()


def test_residency_metrics_sample_and_measure_evictions() -> None:
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool = BlockPool(
        num_gpu_blocks=3, enable_caching=True, hash_block_size=BLOCK, metrics_collector=collector
    )
    with patch("time.monotonic_ns", return_value=1_000_000_000):
        (block,) = pool.get_new_blocks(1)
    with patch("time.monotonic_ns", return_value=3_000_000_000):
        pool.touch([block])
    pool.free_blocks([block, block])
    with patch("time.monotonic_ns", return_value=4_000_000_000):
        pool.get_new_blocks(2)  # reuses the block: its residency ends
    (event,) = collector.drain_events()
    assert event.lifetime_seconds == pytest.approx(3.0)
    assert event.idle_seconds == pytest.approx(1.0)
    with pytest.raises(AssertionError):
        KVCacheMetricsCollector(sample_rate=0.0)


def test_spec_dtype_equals_the_torch_dtype_it_was_given() -> None:
    torch = pytest.importorskip("torch")
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float32)
    merged = spec.merge([spec, spec])
    for made in (spec, merged):
        assert made.dtype == torch.float32 and torch.float32 == made.dtype
        assert made.dtype != torch.float16 and made.dtype == "float32"
    assert hash(merged) == hash(spec)


def test_request_may_have_an_empty_prompt() -> None:
    req = Request("r", [], sampling_params=SamplingParams(max_tokens=4))
    assert req.num_prompt_tokens == 0 and req.all_token_ids == []


def test_pop_blocks_for_free_hands_the_blocks_back_unreleased() -> None:
    kv = manager(num_blocks=10)
    req = request("r", list(range(10)))
    hit, num_hit, _ = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, 10, num_hit, hit) is not None
    ids = kv.get_block_ids("r")[0]
    free_before = kv.block_pool.get_num_free_blocks()
    blocks = kv.pop_blocks_for_free(req)
    assert [b.block_id for b in blocks] == ids
    assert kv.get_block_ids("r") == ([],)
    assert kv.block_pool.get_num_free_blocks() == free_before
    kv.block_pool.free_blocks(reversed(blocks))
    assert kv.block_pool.get_num_free_blocks() == free_before + len(ids)


def test_mamba_dtypes_past_the_last_state_are_ignored() -> None:
    from pagedkv.compat.vllm.v1.kv_cache_interface import MambaSpec

    spec = MambaSpec(block_size=BLOCK, shapes=((6144,),), dtypes=("float32", "float32"))
    assert spec.dtypes == ("float32",) and spec.page_size_bytes == 6144 * 4
    with pytest.raises(KVCacheSpecError, match="dtypes"):
        MambaSpec(block_size=BLOCK, shapes=((4,), (8,)), dtypes=("float32",))


def test_coordinator_counts_blocks_to_allocate_without_allocating() -> None:
    kv = manager()
    first = request("a", list(range(10)))
    assert kv.allocate_slots(first, 10) is not None
    kv.free(first)
    second = request("b", [*list(range(8)), 99, 98])
    hit_blocks, num_hit, _ = kv.get_computed_blocks(second)
    assert num_hit == 8
    pool = kv.block_pool
    free_before = pool.get_num_free_blocks()

    def needed(num_tokens: int) -> int:
        return kv.coordinator.get_num_blocks_to_allocate(
            request_id="b",
            num_tokens=num_tokens,
            new_computed_blocks=hit_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=num_hit,
            num_local_computed_tokens=num_hit,
            num_tokens_main_model=num_tokens,
        )

    # Two cached hit blocks sit in the free queue (they count), plus one new block.
    assert needed(10) == 3
    assert needed(13) == 4
    assert pool.get_num_free_blocks() == free_before
    assert "b" not in kv.impl.managers[0].req_to_blocks


def test_hisparse_layout_moves_sparse_mla_to_a_sized_host_group() -> None:
    from types import SimpleNamespace

    from pagedkv.compat.vllm.v1.hisparse.layout import (
        create_hisparse_layout,
        get_hisparse_kv_cache_groups,
    )
    from pagedkv.compat.vllm.v1.kv_cache_interface import (
        HiSparseHotSpec,
        HiSparseResidentSpec,
        MLAAttentionSpec,
    )

    def mla(head_size: int, **fields: object) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=64, num_kv_heads=1, head_size=head_size, dtype="bfloat16", **fields
        )

    specs = {
        "attn": mla(576, is_index_group_leader=True),
        "attn.indexer": mla(128, cache_role="indexer"),
    }
    config = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=SimpleNamespace()),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(index_topk=128), max_model_len=256),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, world_size=1),
    )
    groups = get_hisparse_kv_cache_groups(config, specs)
    source, indexer, resident, hot = groups
    assert source.host_resident and list(source.layer_names) == ["attn"]
    assert list(indexer.layer_names) == ["attn.indexer"] and not indexer.host_resident
    assert isinstance(resident.kv_cache_spec, HiSparseResidentSpec)
    assert isinstance(hot.kv_cache_spec, HiSparseHotSpec)
    assert hot.kv_cache_spec.blocks_per_request == 4  # (1 + 1) x 128 rows of 64
    page = source.kv_cache_spec.page_size_bytes
    layout = create_hisparse_layout(config, groups, host_budget=7 * page)
    assert (layout.host_num_blocks, layout.host_block_stride) == (7, page)
    assert not layout.shared_host_pool and layout.device_groups == [indexer, resident, hot]
    with pytest.raises(ValueError, match="increase host_pool_gib"):
        create_hisparse_layout(config, groups, host_budget=5 * page)
    v4 = {"attn": mla(512, model_version="deepseek_v4")}
    with pytest.raises(ValueError, match="DeepSeek V4"):
        get_hisparse_kv_cache_groups(config, v4)


def test_hisparse_layout_groups_other_layers_after_its_own() -> None:
    from types import SimpleNamespace

    from pagedkv.compat.vllm.v1.hisparse.layout import get_hisparse_kv_cache_groups
    from pagedkv.compat.vllm.v1.kv_cache_interface import MLAAttentionSpec

    def mla(head_size: int, **fields: object) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=head_size, dtype="bfloat16", **fields
        )

    specs = {
        "attn": mla(576, is_index_group_leader=True),
        "attn.indexer": mla(128, cache_role="indexer"),
        "dense": full_spec(),
    }
    config = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=SimpleNamespace()),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(index_topk=8), max_model_len=64),
    )
    *hisparse_groups, dense = get_hisparse_kv_cache_groups(config, specs)
    assert len(hisparse_groups) == 4
    assert list(dense.layer_names) == ["dense"] and dense.kv_cache_spec == full_spec()
