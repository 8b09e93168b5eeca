"""pagedkv.compat.vllm's planning: vLLM's planner API over vLLM configs, answered by
pagedkv's grouping, placement and sizing."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import pytest

from pagedkv.compat.vllm.config import CacheConfig, ModelConfig, SpeculativeConfig, VllmConfig
from pagedkv.compat.vllm.v1.core import kv_cache_planning as planning
from pagedkv.compat.vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
from pagedkv.compat.vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    resolve_kv_cache_block_sizes,
)
from pagedkv.compat.vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from pagedkv.compat.vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups
from pagedkv.planning.planner import plan_kv_cache_configs


def full(heads: int = 2) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=64, dtype="float32")


def window() -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="float32", sliding_window=4
    )


def vllm_config(max_model_len: int = 64, layout: str | None = "LBNHC") -> VllmConfig:
    config = VllmConfig(model_config=ModelConfig(max_model_len=max_model_len))
    config.cache_config.kv_cache_layout = layout
    config.cache_config.prefix_cache_retention_interval = None
    return config


def configs(config: VllmConfig, specs: list[dict], memory: list[int]) -> list[KVCacheConfig]:
    groups = planning.get_global_kv_cache_groups(config, specs)
    return planning.get_kv_cache_configs(config, specs, memory, groups)


def test_vllm_shapes_compare_equal_to_what_vllm_builds() -> None:
    page = full().page_size_bytes
    (planned,) = configs(vllm_config(), [{"a": full(), "b": full()}], [page * 2 * 10])
    expected = KVCacheConfig(
        10,
        [KVCacheTensor(page * 20, ["a", "b"], page * 10, page)],
        [KVCacheGroupSpec(["a", "b"], full())],
    )
    assert planned == expected
    assert planned.kv_cache_groups[0].layer_names == ["a", "b"]


def test_the_smallest_worker_sets_the_block_count_and_groups_project() -> None:
    page = full().page_size_bytes
    specs = [{"a": full(), "b": full()}, {"c": window(), "d": window()}]
    memory = [page * 2 * 10, page * 2 * 20]
    first, second = configs(vllm_config(max_model_len=16), specs, memory)
    assert first.num_blocks == second.num_blocks == 10
    assert [g.layer_names for g in first.kv_cache_groups] == [["a", "b"], []]
    assert [g.layer_names for g in second.kv_cache_groups] == [[], ["c", "d"]]
    assert second.kv_cache_tensors[0].size == page * 2 * 10


def test_auto_fit_lowers_max_model_len_in_place_and_checks_raise_value_error() -> None:
    page = full().page_size_bytes
    config = vllm_config(max_model_len=1024)
    config.model_config.original_max_model_len = -1
    configs(config, [{"a": full()}], [page * 33])  # 32 usable blocks after the null block
    assert config.model_config.max_model_len == 32 * 16
    too_long = vllm_config(max_model_len=1024)
    with pytest.raises(ValueError, match="max seq len"):
        configs(too_long, [{"a": full()}], [page * 33])


def test_mixed_pages_need_a_block_compact_layout() -> None:
    groups = [
        KVCacheGroupSpec(
            ["a", "b"], UniformTypeKVCacheSpecs.from_specs({"a": full(2), "b": full(1)})
        ),
        KVCacheGroupSpec(
            ["c", "d"], UniformTypeKVCacheSpecs.from_specs({"c": full(2), "d": full(1)})
        ),
    ]
    with pytest.raises(ValueError, match="cannot express this model's mixed page sizes"):
        planning.get_kv_cache_config_from_groups(vllm_config(), groups, 1 << 20)
    with pytest.raises(ValueError, match="has not been resolved"):
        planning.get_kv_cache_config_from_groups(vllm_config(layout=None), groups, 1 << 20)
    packed = planning.get_kv_cache_config_from_groups(vllm_config(layout="BLHNC"), groups, 1 << 20)
    assert {t.block_stride for t in packed.kv_cache_tensors} == {full(2).page_size_bytes * 3 // 2}


def test_builder_resolution_follows_the_patched_platform() -> None:
    builder = get_kv_cache_config_builder(vllm_config())
    assert type(builder) is planning.DefaultKVCacheConfigBuilder
    with patch("pagedkv.compat.vllm.platforms.current_platform") as platform:
        platform.get_kv_cache_config_builder_cls.return_value = (
            "pagedkv.compat.vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"
        )
        assert get_kv_cache_config_builder(MagicMock()) is not builder


def test_builder_grouping_is_checked_with_vllms_assertions() -> None:
    class Partial(planning.DefaultKVCacheConfigBuilder):
        def get_kv_cache_groups(self, vllm_config: object, kv_cache_spec: dict) -> list:
            return [KVCacheGroupSpec(["a"], full())]

    with pytest.raises(AssertionError, match="miss layers"):
        planning.get_kv_cache_groups_from_builder(
            Partial(), vllm_config(), {"a": full(), "b": full()}
        )


def test_scheduler_view_and_block_sizes() -> None:
    page = full().page_size_bytes
    config = vllm_config()
    (planned,) = configs(config, [{"a": full(2), "b": full(1)}], [page * 20])
    scheduler = generate_scheduler_kv_cache_config([planned])
    assert scheduler.kv_cache_groups[0].kv_cache_spec == full(2)
    assert resolve_kv_cache_block_sizes(planned, config) == (16, 16)


def test_kv_sharing_layers_join_their_targets_group() -> None:
    groups = [KVCacheGroupSpec(["l0"], full()), KVCacheGroupSpec(["l1"], full())]
    runner_only: set[str] = set()
    add_kv_sharing_layers_to_kv_cache_groups({"l2": "l0", "l3": "l1"}, groups, runner_only)
    assert [g.layer_names for g in groups] == [["l0", "l2"], ["l1", "l3"]]
    assert runner_only == {"l2", "l3"}


def test_the_base_spec_is_constructible_and_covers_pagedkv_specs() -> None:
    a, b = KVCacheSpec(block_size=1), KVCacheSpec(block_size=2)
    assert not planning.is_kv_cache_spec_uniform({"a": a, "b": b})
    assert isinstance(full(), KVCacheSpec)
    with pytest.raises(NotImplementedError):
        _ = a.page_size_bytes


def test_cache_config_layout_resolution() -> None:
    cache = CacheConfig()
    with pytest.raises(ValueError, match="not been resolved"):
        cache.get_resolved_kv_cache_layout()
    cache.kv_cache_layout = "NHD"  # vLLM's legacy name
    assert cache.get_resolved_kv_cache_layout().name == "LBNHC"


def _speculative(method: str, tokens: int, **extra: object) -> VllmConfig:
    config = vllm_config()
    config.speculative_config = SpeculativeConfig(
        method=method, num_speculative_tokens=tokens, **extra
    )
    return config


MTP_3 = SimpleNamespace(hf_config=SimpleNamespace(num_nextn_predict_layers=3))
SPECULATIVE_CASES = [
    pytest.param(_speculative("eagle", 3), id="eagle"),
    pytest.param(_speculative("eagle3", 2, disable_eagle_block_drop=True), id="no-drop"),
    pytest.param(_speculative("mtp", 3, draft_model_config=MTP_3), id="mtp-3-modules"),
    pytest.param(_speculative("mtp", 2), id="mtp-1-module"),
    pytest.param(_speculative("dflash", 4), id="dflash"),
    pytest.param(_speculative("ngram", 5), id="ngram"),
]


@pytest.mark.parametrize("config", SPECULATIVE_CASES)
def test_to_engine_config_carries_the_speculative_config(config: VllmConfig) -> None:
    """The planner reads the drafter as vLLM's config states it: the same prefill
    lookahead, the same EAGLE block drop."""
    spec = config.speculative_config
    scheduler = config.to_engine_config().scheduler
    assert scheduler.speculative_method == spec.method
    assert scheduler.num_speculative_tokens == spec.num_speculative_tokens
    assert scheduler.num_prefill_lookahead_tokens == config.num_prefill_lookahead_tokens
    assert scheduler.use_eagle_block_drop == spec.use_eagle_block_drop()


def test_without_a_speculative_config_the_planner_plans_no_drafter() -> None:
    scheduler = vllm_config().to_engine_config().scheduler
    assert scheduler.speculative_method is None
    assert scheduler.num_prefill_lookahead_tokens == 0


def test_pagedkv_plans_a_drafter_from_the_vllm_config() -> None:
    """pagedkv's planner, given ``to_engine_config()``, marks the draft layer's group
    and keeps the lookahead tokens in sliding windows, as vLLM's planning does."""
    config = _speculative("mtp", 3, draft_model_config=MTP_3)
    draft = dataclasses.replace(full(), is_draft=True)
    specs = {"target": window(), "draft": draft}
    page = full().page_size_bytes
    planned = plan_kv_cache_configs(config.to_engine_config(), [specs], [page * 64])
    by_layer = {name: g for g in planned.groups for name in g.layer_names}
    assert by_layer["draft"].is_eagle_group and not by_layer["target"].is_eagle_group
    assert by_layer["target"].kv_cache_spec.extra_retained_tokens == 2
