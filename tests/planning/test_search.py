"""The least-waste grouping search: tie-breaks, limits, the platform's block multiple,
rescoring."""

from __future__ import annotations

from pagedkv import EngineConfig, plan_kv_cache
from pagedkv.builders.search import MAX_GROUPS, score, search
from pagedkv.planning.grouping import make_buckets
from pagedkv.platforms import GenericPlatform, set_current_platform

from .models import GiB, full, jamba, sliding

CONFIG = EngineConfig.create(max_model_len=32768, kv_cache_grouping_rule="least-waste")


def mixed(num_sliding: int, num_full: int, window: int = 64) -> dict:  # type: ignore[type-arg]
    return {f"s{i}": sliding(window) for i in range(num_sliding)} | {
        f"f{i}": full() for i in range(num_full)
    }


def test_chosen_is_the_cheapest_within_tolerance_with_fewest_groups() -> None:
    buckets = make_buckets(mixed(12, 8))
    _, chosen, scored, _ = search(buckets, CONFIG, 1)
    best = min(s.bytes_per_request for s in scored)
    assert chosen.bytes_per_request <= best * 1.01
    fewer = [
        s for s in scored if s.bytes_per_request <= best * 1.01 and s.num_groups < chosen.num_groups
    ]
    assert fewer == []
    assert chosen.group_size == 4  # gcd(12, 8): no padding, 5 groups


def test_prefers_small_block_sizes_on_ties() -> None:
    _, chosen, scored, _ = search(make_buckets(mixed(6, 6)), CONFIG, 1)
    assert chosen.block_sizes == (16,)
    assert any(s.block_sizes == (32,) for s in scored)


def test_group_count_is_capped() -> None:
    # 67 and 13 share no divisor: one layer per group would be 80 groups.
    _, chosen, scored, _ = search(make_buckets(mixed(67, 13, window=4096)), CONFIG, 1)
    assert max(s.num_groups for s in scored) <= MAX_GROUPS
    assert chosen.num_groups <= MAX_GROUPS


def test_score_counts_padding_layers() -> None:
    (page, *_) = search(make_buckets(mixed(3, 2)), CONFIG, 1).scored[0:1]
    s = score(page.page, 2)
    assert s.num_groups == 3 and s.bytes_per_block == 2 * 65536
    assert s.waste_fraction > 0


def test_platform_block_size_multiple_rounds_the_attention_block() -> None:
    class Multiple32(GenericPlatform):
        @classmethod
        def kv_cache_block_size_multiple(cls, config):  # type: ignore[no-untyped-def]
            return 32

    plan = plan_kv_cache(CONFIG, [jamba()], [8 * GiB])
    assert plan.block_size == 80
    set_current_platform(Multiple32)
    plan = plan_kv_cache(CONFIG, [jamba()], [8 * GiB])
    assert plan.block_size == 96
    assert plan.groups[0].padding_bytes == 4 * (96 * 4096 - 311_296)


def test_auto_fit_rescores_at_the_fitted_length() -> None:
    # At 32K tokens padding one sliding slot costs > 1 % and the search avoids it;
    # at the ~1M tokens that fit, vLLM's two groups are within 1 % and are kept.
    specs = mixed(12, 13)
    config = CONFIG.replace(max_kv_cache_groups=25)  # gcd(12, 13) = 1: 25 groups to pad none
    at_32k = plan_kv_cache(config, [specs], [64 * GiB])
    assert next(a for a in at_32k.alternatives if a.chosen).name != "vllm"
    fitted = plan_kv_cache(config.replace(max_model_len=-1), [specs], [64 * GiB])
    assert fitted.max_model_len > 500_000
    assert next(a for a in fitted.alternatives if a.chosen).name == "vllm"
    assert fitted.num_groups == 2
    assert all(a.reference_len > 500_000 for a in fitted.alternatives)


def test_vllm_rule_builder_keeps_vllms_grouping() -> None:
    from pagedkv.config import ModelConfig
    from pagedkv.planning import VLLMRuleKVCacheConfigBuilder
    from pagedkv.platforms import qualname_of

    from .models import gemma3_27b

    model = ModelConfig(
        max_model_len=131072, kv_cache_config_builder=qualname_of(VLLMRuleKVCacheConfigBuilder)
    )
    config = CONFIG.replace(model=model, async_scheduling=True)
    plan = plan_kv_cache(config, [gemma3_27b()], [80 * GiB])
    assert plan.num_groups == 7 and plan.bytes_per_block == 1_310_720
    assert plan.alternatives == ()  # held to vLLM's rule: nothing searched


def test_bad_platform_block_multiple_and_bad_limit() -> None:
    import pytest

    from pagedkv import PlanningError, PlatformError

    class Broken(GenericPlatform):
        @classmethod
        def kv_cache_block_size_multiple(cls, config):  # type: ignore[no-untyped-def]
            return 0

    set_current_platform(Broken)
    with pytest.raises(PlatformError, match="kv_cache_block_size_multiple"):
        plan_kv_cache(CONFIG, [jamba()], [8 * GiB])
    set_current_platform(None)
    with pytest.raises(PlanningError, match="max_model_len_limit"):
        plan_kv_cache(CONFIG, [jamba()], [8 * GiB], max_model_len_limit=0)


def test_auto_fit_reports_alternatives_at_the_fitted_length_when_groups_stay() -> None:
    from .models import llama_8b

    plan = plan_kv_cache(CONFIG.replace(max_model_len=-1), [llama_8b(4)], [1 * GiB])
    assert plan.max_model_len > 32768
    assert plan.alternatives
    assert all(a.reference_len == plan.max_model_len for a in plan.alternatives)
