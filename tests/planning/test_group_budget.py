"""The group budget (CacheConfig.max_kv_cache_groups) of the least-waste grouping search."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import ConfigError, EngineConfig, PlanningError, plan_kv_cache
from pagedkv.builders.search import DEFAULT_MAX_KV_CACHE_GROUPS, TOLERANCE, search
from pagedkv.planning.grouping import make_buckets

from .models import GiB, full, gemma3_27b, sliding

CONFIG = EngineConfig.create(
    max_model_len=131072, async_scheduling=True, kv_cache_grouping_rule="least-waste"
)


def mixed(num_sliding: int, num_full: int, window: int = 1024) -> dict:  # type: ignore[type-arg]
    return {f"s{i}": sliding(window) for i in range(num_sliding)} | {
        f"f{i}": full() for i in range(num_full)
    }


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "8"])
def test_budget_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_kv_cache_groups"):
        EngineConfig.create(max_kv_cache_groups=bad, kv_cache_grouping_rule="least-waste")


@pytest.mark.parametrize(
    ("budget", "num_groups", "bytes_per_block"),
    [
        (7, 7, 1_310_720),
        (12, 7, 1_310_720),
        (13, 13, 655_360),
        (30, 13, 655_360),
        (31, 31, 262_144),
    ],
)
def test_gemma_grouping_per_budget(budget: int, num_groups: int, bytes_per_block: int) -> None:
    plan = plan_kv_cache(CONFIG.replace(max_kv_cache_groups=budget), [gemma3_27b()], [80 * GiB])
    assert (plan.num_groups, plan.bytes_per_block) == (num_groups, bytes_per_block)
    assert all(a.max_groups == budget for a in plan.alternatives)
    chosen = next(a for a in plan.alternatives if a.chosen)
    assert chosen.within_budget
    assert all(a.within_budget == (a.num_groups <= budget) for a in plan.alternatives)


def test_budget_of_seven_keeps_vllms_grouping() -> None:
    plan = plan_kv_cache(CONFIG.replace(max_kv_cache_groups=7), [gemma3_27b()], [80 * GiB])
    assert next(a for a in plan.alternatives if a.chosen).name == "vllm"


def test_unreachable_budget_is_an_error_naming_the_minimum() -> None:
    config = CONFIG.replace(max_kv_cache_groups=1)
    with pytest.raises(PlanningError, match=r"max_kv_cache_groups=1 .* at least 2"):
        plan_kv_cache(config, [gemma3_27b()], [80 * GiB])


def test_default_budget_gives_way_to_the_fewest_groups_possible() -> None:
    # 20 different windows: 20 buckets, so no grouping has fewer than 20 groups.
    specs = {f"s{w}": sliding(64 * (w + 1)) for w in range(20)} | {"f": full()}
    plan = plan_kv_cache(CONFIG, [specs], [80 * GiB])
    assert plan.num_groups == 21 > DEFAULT_MAX_KV_CACHE_GROUPS
    chosen = next(a for a in plan.alternatives if a.chosen)
    assert chosen.max_groups == 21 and chosen.within_budget


def test_vllm_rule_builder_is_not_held_to_the_budget() -> None:
    from pagedkv.config import ModelConfig
    from pagedkv.planning import VLLMRuleKVCacheConfigBuilder
    from pagedkv.platforms import qualname_of

    model = ModelConfig(
        max_model_len=131072, kv_cache_config_builder=qualname_of(VLLMRuleKVCacheConfigBuilder)
    )
    config = CONFIG.replace(model=model, max_kv_cache_groups=3)
    plan = plan_kv_cache(config, [gemma3_27b()], [80 * GiB])
    assert plan.num_groups == 7 and plan.alternatives == ()


def test_the_budget_needs_a_searching_rule() -> None:
    with pytest.raises(ConfigError, match="max_kv_cache_groups bounds a searched grouping"):
        EngineConfig.create(max_kv_cache_groups=8)  # vLLM's grouping has no budget
    with pytest.raises(ConfigError, match="kv_cache_grouping_rule must be 'vllm' or 'least-waste'"):
        EngineConfig.create(kv_cache_grouping_rule="fewest")


@settings(max_examples=40, deadline=None)
@given(
    num_sliding=st.integers(1, 40),
    num_full=st.integers(1, 20),
    small=st.integers(2, 40),
    extra=st.integers(0, 40),
)
def test_budget_is_kept_and_more_budget_never_costs_memory(
    num_sliding: int, num_full: int, small: int, extra: int
) -> None:
    buckets = make_buckets(mixed(num_sliding, num_full))
    config = EngineConfig.create(max_model_len=32768, kv_cache_grouping_rule="least-waste")
    tight = search(buckets, config, 1, max_groups=small)
    loose = search(buckets, config, 1, max_groups=small + extra)
    for result, budget in ((tight, small), (loose, small + extra)):
        assert result.chosen.num_groups <= budget == result.max_groups
        within = [s for s in result.scored if s.num_groups <= budget]
        best = min(s.bytes_per_request for s in within)
        assert result.chosen.bytes_per_request <= best * (1 + TOLERANCE)
    best_tight = min(s.bytes_per_request for s in tight.scored if s.num_groups <= small)
    assert loose.chosen.bytes_per_request <= best_tight * (1 + TOLERANCE)


def test_concurrency_at_an_unplanned_length_names_the_planned_ones() -> None:
    plan = plan_kv_cache(
        EngineConfig.create(max_model_len=8192), [{"f": full()}], [1 * GiB], context_lengths=[1024]
    )
    assert plan.concurrency_at(1024).context_len == 1024
    with pytest.raises(PlanningError, match=r"context_len=2048.*8192, 1024"):
        plan.concurrency_at(2048)
