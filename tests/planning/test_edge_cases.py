"""Reference section 9, edge cases 48-66 (planning), with pagedkv's behaviour where it differs."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv import (
    CrossAttentionSpec,
    EngineConfig,
    FullAttentionSpec,
    InsufficientMemoryError,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheSpecError,
    KVCacheTensor,
    MLAAttentionSpec,
    PlanningError,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    get_kv_cache_configs,
    plan_kv_cache,
)
from pagedkv.capacity.plan import scheduler_block_size
from pagedkv.planning.grouping import (
    check_exact_partition,
    groups_from_buckets,
    make_buckets,
    vllm_group_size,
)
from pagedkv.planning.sizing import RequestCost

from .models import GiB, full, gemma3_27b, group_spec_of, llama_8b, sliding

CONFIG = EngineConfig.create(max_model_len=8192)
LEAST_WASTE = CONFIG.replace(kv_cache_grouping_rule="least-waste")


def only(plan_specs: dict, memory: int = 8 * GiB, config: EngineConfig = CONFIG):  # type: ignore[no-untyped-def]
    return plan_kv_cache(config, [plan_specs], [memory])


def test_48_mixed_block_sizes_are_not_one_uniform_type_group() -> None:
    specs = {"a": full(heads=8, bs=16), "b": full(heads=4, bs=32)}
    assert not UniformTypeKVCacheSpecs.is_uniform_type(specs)
    plan = only(specs)
    assert sorted(g.block_size for g in plan.groups) == [16, 32]
    assert plan.block_size == 16


def test_49_different_promoted_windows_form_separate_groups() -> None:
    # vLLM raises out of grouping; pagedkv puts them in one uniform-type group where
    # each layer keeps its own spec (they size the same).
    a, b = full(sliding_window=1024), full(sliding_window=512)
    with pytest.raises(KVCacheSpecError, match="same window"):
        FullAttentionSpec.merge([a, b])
    specs = {f"a{i}": a for i in range(3)} | {f"b{i}": b for i in range(3)}
    plan = only(specs)
    assert plan.num_groups == 1
    (group,) = plan.configs[0].kv_cache_groups
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
    assert group.layer_specs()["b0"] == b
    assert plan.waste_fraction == 0.0


def test_50_group_size_rule() -> None:
    assert vllm_group_size([12, 13]) == 13
    assert vllm_group_size([52, 10]) == 10
    assert vllm_group_size([15, 10]) == 10  # 15 is not < 1.5 * 10
    specs = {f"s{i}": sliding(128) for i in range(12)} | {f"f{i}": full() for i in range(13)}
    plan = only(specs)  # vLLM's grouping is the default
    assert [g.num_layers for g in plan.groups] == [12, 13]
    vllm = next(a for a in only(specs, config=LEAST_WASTE).alternatives if a.name == "vllm")
    assert (vllm.num_groups, vllm.layers_per_group) == (2, 13)


def test_51_groups_take_layers_by_stride() -> None:
    specs = {f"s{i}": sliding(128) for i in range(6)} | {f"f{i}": full() for i in range(2)}
    groups = groups_from_buckets(make_buckets(specs), 2)
    assert [g.layer_names for g in groups[:3]] == [("s0", "s3"), ("s1", "s4"), ("s2", "s5")]


def test_52_padding_percentage_is_pad_over_bucket_length() -> None:
    config = EngineConfig.create(
        max_model_len=131072, async_scheduling=True, kv_cache_grouping_rule="least-waste"
    )
    plan = plan_kv_cache(config, [gemma3_27b()], [80 * GiB])
    vllm = next(a for a in plan.alternatives if a.name == "vllm")
    assert "8 padding layers for the 52-layer sliding_window bucket" in vllm.description
    assert "15.38%" in vllm.description


class TestPageUnification53:
    def test_divisible_attention_scaled_by_block_size(self) -> None:
        specs = {"f": full(heads=8), "s": sliding(256, heads=4)}
        plan = only(specs)
        sizes = {g.kind: g.block_size for g in plan.groups}
        assert sizes == {"full_attention": 16, "sliding_window": 32}
        assert plan.waste_fraction == 0.0

    def test_non_divisible_attention_padded_by_vllm_scaled_by_search(self) -> None:
        specs = {f"f{i}": full(heads=3) for i in range(2)} | {
            f"s{i}": sliding(256, heads=2) for i in range(2)
        }
        vllm = only(specs)  # the default: 16 KiB pages padded to 24 KiB
        assert vllm.num_groups == 2 and vllm.waste_fraction > 0.0
        assert {g.kind: g.block_size for g in vllm.groups} == {
            "full_attention": 16,
            "sliding_window": 16,
        }
        plan = only(specs, config=LEAST_WASTE)
        assert next(a for a in plan.alternatives if a.name == "vllm").waste_fraction > 0.0
        assert plan.waste_fraction == 0.0
        assert {g.kind: g.block_size for g in plan.groups} == {
            "full_attention": 32,
            "sliding_window": 48,
        }
        assert all(g.padding_bytes == 0 for g in plan.groups)

    def test_mla_is_never_padded(self) -> None:
        mla = MLAAttentionSpec(block_size=64, head_size=576)  # 73,728 B pages
        specs = {"m0": mla, "m1": mla, "s0": sliding(256, heads=8, bs=64)}  # 262,144 B pages
        # vLLM cannot unify the pages: its fallback makes the window full attention and
        # puts every layer in one uniform-type group.
        vllm = only(specs, memory=40 * GiB)
        (group,) = vllm.configs[0].kv_cache_groups
        assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
        assert group.layer_specs()["s0"].kind == "full_attention"
        assert vllm.groups[0].padding_bytes == 0
        plan = only(specs, memory=40 * GiB, config=LEAST_WASTE)
        assert not any(a.name == "vllm" for a in plan.alternatives)
        mla_groups = [g for g in plan.groups if g.kind == "mla_attention"]
        assert mla_groups and all(g.padding_bytes == 0 for g in mla_groups)

    def test_mla_that_cannot_be_unified_is_an_error(self) -> None:
        # Two unpaddable pages (1,154 B and 1,158 B) with no common multiple in reach.
        odd = MLAAttentionSpec(block_size=1, head_size=577)
        other = SlidingWindowMLASpec(block_size=1, head_size=579, sliding_window=128)
        with pytest.raises(PlanningError, match="cannot unify the page sizes"):
            only({"m": odd, "s": other}, config=LEAST_WASTE)

    def test_mla_found_a_common_page_by_search(self) -> None:
        odd = MLAAttentionSpec(block_size=1, head_size=577)  # 1,154 B per token
        # vLLM's pages cannot be unified; its fallback allocates the window as full
        # attention at the MLA block size, in one uniform-type group.
        (fallback,) = only({"m": odd, "s": sliding(256)}).groups
        assert fallback.num_layers == 2 and fallback.block_size == 1
        plan = only({"m": odd, "s": sliding(256)}, config=LEAST_WASTE)
        mla = next(g for g in plan.groups if g.kind == "mla_attention")
        assert mla.padding_bytes == 0 and mla.page_size_bytes % 1154 == 0


def test_54_attention_free_model() -> None:
    plan = only({})
    assert plan.num_groups == 0 and plan.num_blocks == 1
    assert plan.configs[0].kv_cache_tensors == ()
    assert plan.max_model_len == 8192
    fitted = plan_kv_cache(
        EngineConfig.create(max_model_len=-1), [{}], [0], max_model_len_limit=4096
    )
    assert fitted.max_model_len == 4096


class TestBlockCounts55:
    def test_blocks_from_memory(self) -> None:
        plan = only(llama_8b(), memory=2 * GiB + 123)
        assert plan.num_blocks == 1024

    def test_override_replaces_count(self) -> None:
        config = CONFIG.replace(num_gpu_blocks_override=100, max_model_len=1024)
        plan = plan_kv_cache(config, [llama_8b(num_layers=2)], [1 * GiB])
        assert plan.num_blocks == 100
        assert plan.configs[0].kv_cache_tensors[0].size == 100 * 2 * 65536

    def test_override_beyond_memory_is_an_error(self) -> None:
        config = CONFIG.replace(num_gpu_blocks_override=100_000)
        with pytest.raises(InsufficientMemoryError, match="num_gpu_blocks_override=100000"):
            plan_kv_cache(config, [llama_8b()], [1 * GiB])

    def test_override_counts_in_max_model_len_check(self) -> None:
        # vLLM PR #41069: the check ignored the override and the scheduler hung.
        config = CONFIG.replace(num_gpu_blocks_override=100)
        with pytest.raises(InsufficientMemoryError) as err:
            plan_kv_cache(config, [llama_8b()], [8 * GiB])
        assert "CacheConfig.num_gpu_blocks_override=100 allows 100 blocks" in str(err.value)
        assert "largest max_model_len that fits is 1584" in str(err.value)


def test_56_workers_replanned_to_the_minimum() -> None:
    specs = llama_8b(num_layers=4)
    memory = [1 * GiB, 1 * GiB // 2, 3 * GiB]
    configs = get_kv_cache_configs(CONFIG, [specs] * 3, memory)
    blocks = (1 * GiB // 2) // (4 * 65536)
    assert [c.num_blocks for c in configs] == [blocks] * 3
    assert all(c.kv_cache_tensors[0].size == blocks * 4 * 65536 for c in configs)


def test_57_null_block_reserved() -> None:
    bpb = 32 * 65536
    need = 8192 // 16
    with pytest.raises(InsufficientMemoryError):
        only(llama_8b(), memory=need * bpb)
    assert only(llama_8b(), memory=(need + 1) * bpb).usable_blocks == need


class TestMemoryMessages58:
    def test_no_memory(self) -> None:
        with pytest.raises(InsufficientMemoryError, match="no memory available") as err:
            only(llama_8b(), memory=0)
        assert "worker 0" in str(err.value)

    def test_not_enough_names_need_available_and_estimate(self) -> None:
        with pytest.raises(InsufficientMemoryError) as err:
            only(llama_8b(), memory=101 * 32 * 65536)
        text = str(err.value)
        assert "max_model_len=8192" in text and "needs 512 KV cache blocks" in text
        assert "1600" in text  # the largest length that fits: 100 blocks of 16 tokens
        assert "0.20 GiB" in text

    def test_estimate_sentence_only_when_something_fits(self) -> None:
        with pytest.raises(InsufficientMemoryError) as err:
            only(llama_8b(), memory=1 * 32 * 65536)
        assert "not even a one-token request fits" in str(err.value)
        assert "largest max_model_len" not in str(err.value)


def test_59_estimate_returns_zero_and_leaves_config_alone() -> None:
    groups = [KVCacheGroupSpec(layer_names=("a",), kv_cache_spec=full())]
    cost = RequestCost(groups, CONFIG)
    assert cost.largest_fitting(0, 8192) == 0
    assert cost.largest_fitting(10, 8192) == 160
    with pytest.raises(InsufficientMemoryError):
        only(llama_8b(), memory=1 * 32 * 65536)
    assert CONFIG.max_model_len == 8192


class TestAutoFit60:
    def test_only_with_minus_one(self) -> None:
        plan = only(llama_8b(), memory=101 * 32 * 65536, config=CONFIG.replace(max_model_len=-1))
        assert plan.max_model_len == 1600 and plan.max_model_len_auto_fitted
        assert plan.configs[0].max_model_len == 1600
        assert not only(llama_8b()).max_model_len_auto_fitted

    def test_nothing_fits(self) -> None:
        with pytest.raises(InsufficientMemoryError, match="cannot auto-fit max_model_len"):
            only(llama_8b(), memory=1 * 32 * 65536, config=CONFIG.replace(max_model_len=-1))


def test_61_partition_check_names_overlaps_missing_and_unknown() -> None:
    spec = full()
    groups = [
        KVCacheGroupSpec(layer_names=("a", "b"), kv_cache_spec=spec),
        KVCacheGroupSpec(layer_names=("b", "zz"), kv_cache_spec=spec),
    ]
    with pytest.raises(PlanningError) as err:
        check_exact_partition(groups, ["a", "b", "c"])
    text = str(err.value)
    assert "more than one group: 'b'" in text
    assert "in no group: 'c'" in text
    assert "no KV cache spec: 'zz'" in text  # vLLM lets unknown names through


def test_62_same_layer_different_specs_across_workers() -> None:
    with pytest.raises(PlanningError, match=r"layer 'x' has different KV cache specs on worker 0"):
        get_kv_cache_configs(CONFIG, [{"x": full()}, {"x": full(heads=4)}], [GiB, GiB])


def test_63_sliding_window_keeps_lookahead_tokens() -> None:
    # A 4-module MTP drafter reads 4 prompt tokens past a chunk: 3 extra retained.
    config = CONFIG.replace(speculative_method="mtp", num_speculative_tokens=4, num_draft_modules=4)
    specs = {"s": sliding(128), "f": full()}
    (kv,) = get_kv_cache_configs(config, [specs], [GiB])
    spec = group_spec_of(kv, "s")
    assert isinstance(spec, SlidingWindowSpec) and spec.extra_retained_tokens == 3
    (plain,) = get_kv_cache_configs(CONFIG, [specs], [GiB])
    assert group_spec_of(plain, "s").extra_retained_tokens == 0  # type: ignore[attr-defined]


def test_64_draft_layers_group_with_targets() -> None:
    specs = {"t0": full(), "t1": full(), "draft": dataclasses.replace(full(), is_draft=True)}
    plan = only(specs)
    assert plan.num_groups == 1 and plan.groups[0].num_layers == 3


def test_65_distinct_quantised_formats_never_share_a_group_spec() -> None:
    # vLLM's KVQuantMode.CUSTOM aliases OCTAVE_K3V4; here each format keeps its own page.
    specs = {"a": full(dtype="int8_per_token_head"), "b": full(dtype="fp8_per_token_head")}
    plan = only(specs)
    (group,) = plan.configs[0].kv_cache_groups
    layer_specs = group.layer_specs()
    assert layer_specs["a"].dtype != layer_specs["b"].dtype  # type: ignore[attr-defined]


def test_66_concurrency_excludes_the_null_block() -> None:
    plan = only(llama_8b(), memory=1025 * 32 * 65536)
    point = plan.max_concurrency[0]
    assert point.vllm_max_concurrency == 1025 / 512  # vLLM counts the null block
    assert point.max_concurrency == 1024 / 512
    assert point.max_requests == 2


def test_64_draft_flag_survives_page_unification() -> None:
    from pagedkv.builders.search import page_candidates

    draft = dataclasses.replace(full(heads=8), is_draft=True)
    specs = {"f": full(heads=8), "d": draft, "s": sliding(128, heads=4)}
    _, found = page_candidates(make_buckets(specs), CONFIG, 1)
    for candidate in found:
        by_layer = {n: spec for b in candidate.buckets for n, spec in zip(b.layer_names, b.specs)}
        assert by_layer["d"].is_draft and not by_layer["f"].is_draft


def test_scheduler_block_size_is_the_smallest_prefix_cacheable_one() -> None:
    def group(name: str, spec: KVCacheSpec) -> KVCacheGroupSpec:
        return KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=spec)

    cross = group("x", CrossAttentionSpec(block_size=8, num_kv_heads=8, head_size=128))
    groups = [cross, group("f", full(bs=32)), group("s", sliding(128, bs=16))]
    # The cross-attention group is never prefix cached: its smaller block does not count.
    assert scheduler_block_size(groups, 99) == 16
    assert scheduler_block_size([cross], 99) == 8
    empty = KVCacheGroupSpec(layer_names=(), kv_cache_spec=full(bs=4))
    assert scheduler_block_size([empty, *groups[1:]], 99) == 16
    assert scheduler_block_size([], 99) == 99


def test_tensor_regions() -> None:
    tensor = KVCacheTensor(
        size=10_000,
        layers=("a", "b", "c"),
        layer_stride=3_000,
        block_stride=100,
        page_size_bytes=90,
        offset=40,
        host_resident=True,
    )
    regions = tensor.regions()
    assert [r.layer_name for r in regions] == list(tensor.layers)
    assert regions[2] == ("c", 6_040, 100, 90, True)
    assert regions[1].block_range(3) == (3_340, 3_430)
