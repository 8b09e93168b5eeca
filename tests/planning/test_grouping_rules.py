"""Grouping rules by name: vLLM's is the default, pagedkv's least-waste search an opt-in."""

from __future__ import annotations

import pytest

from pagedkv import EngineConfig, plan_kv_cache
from pagedkv.config import KV_CACHE_GROUPING_RULES, ModelConfig
from pagedkv.errors import ConfigError
from pagedkv.models import get_kv_cache_specs, list_bundled_models, load_model_config
from pagedkv.planning import KVCachePlan, VLLMRuleKVCacheConfigBuilder
from pagedkv.planning.grouping import (
    GroupingChoice,
    grouping_rule,
    make_buckets,
    single_group,
    vllm_group_size,
    vllm_grouping,
)
from pagedkv.platforms import qualname_of

from .models import GiB, deepseek_v3, jamba, llama_8b

LEN_128K = 131072


def bundled(name: str, config: EngineConfig) -> KVCachePlan:
    specs = get_kv_cache_specs(load_model_config(name), config=config)
    return plan_kv_cache(config, specs, [80 * GiB] * len(specs))


def test_gemma3_27b_default_is_vllms_seven_groups() -> None:
    plan = bundled("gemma-3-27b-it", EngineConfig.create(max_model_len=LEN_128K))
    assert [g.num_layers for g in plan.groups] == [9, 9, 9, 9, 8, 8, 10]
    assert plan.bytes_per_block == 10 * 128 * 1024
    assert round(plan.max_concurrency[0].bytes_per_request / GiB, 2) == 14.23
    assert plan.alternatives == ()
    opt_in = bundled(
        "gemma-3-27b-it",
        EngineConfig.create(max_model_len=LEN_128K, kv_cache_grouping_rule="least-waste"),
    )
    assert opt_in.num_groups == 13
    assert round(opt_in.max_concurrency[0].bytes_per_request / GiB, 2) == 13.87


@pytest.mark.parametrize("name", list_bundled_models())
def test_default_equals_the_vllm_rule_builder_on_every_bundled_model(name: str) -> None:
    config = EngineConfig.create(max_model_len=32768)
    pinned = ModelConfig(
        max_model_len=32768, kv_cache_config_builder=qualname_of(VLLMRuleKVCacheConfigBuilder)
    )
    least_waste = config.replace(kv_cache_grouping_rule="least-waste")
    default = bundled(name, config)
    specs = get_kv_cache_specs(load_model_config(name), config=config)
    merged = {n: s for worker in specs for n, s in worker.items()}
    buckets = make_buckets(merged)
    if single_group(merged) is None:  # a hybrid: groups of <= vLLM's group size, one full
        size = vllm_group_size([len(b) for b in buckets])
        assert max(g.num_layers for g in default.groups) == size
        assert default.num_groups == sum(-(-len(b) // size) for b in buckets)
    assert default.groups == bundled(name, config.replace(model=pinned)).groups
    # the pinned builder ignores the config's rule
    assert default.groups == bundled(name, least_waste.replace(model=pinned)).groups


@pytest.mark.parametrize(
    ("specs", "num_groups", "bytes_per_block"),
    [(llama_8b(), 1, 2 << 20), (jamba(), 8, 1_310_720), (deepseek_v3(), 1, 4_497_408)],
    ids=["Llama-3.1-8B", "Jamba-like", "DeepSeek-V3-like"],
)
def test_models_where_both_rules_agree(specs: dict, num_groups: int, bytes_per_block: int) -> None:  # type: ignore[type-arg]
    config = EngineConfig.create(max_model_len=LEN_128K)
    vllm = plan_kv_cache(config, [specs], [80 * GiB])
    searched = plan_kv_cache(
        config.replace(kv_cache_grouping_rule="least-waste"), [specs], [80 * GiB]
    )
    assert (vllm.num_groups, vllm.bytes_per_block) == (num_groups, bytes_per_block)
    assert searched.groups == vllm.groups and searched.configs == vllm.configs


def test_least_waste_builder_selected_by_qualname() -> None:
    builder = "pagedkv.builders.least_waste.LeastWasteKVCacheConfigBuilder"
    model = ModelConfig(max_model_len=LEN_128K, kv_cache_config_builder=builder)
    plan = bundled("gemma-3-27b-it", EngineConfig.create(model=model))
    assert plan.num_groups == 13 and next(a for a in plan.alternatives if a.chosen)


RULE_CALLS: list[int] = []


def counting_rule(config, specs, multiple):  # type: ignore[no-untyped-def]
    RULE_CALLS.append(multiple)
    return vllm_grouping(config, specs, multiple)


def test_a_rule_added_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KV_CACHE_GROUPING_RULES, "mine", qualname_of(counting_rule))
    config = EngineConfig.create(kv_cache_grouping_rule="mine")
    plan = plan_kv_cache(config, [jamba()], [8 * GiB])
    assert RULE_CALLS == [1] and plan.num_groups == 8
    assert isinstance(grouping_rule("mine")(config, jamba(), 1), GroupingChoice)
    with pytest.raises(ConfigError, match="unknown KV cache grouping rule 'other'"):
        grouping_rule("other")
