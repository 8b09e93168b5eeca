"""``largest_max_model_len`` comes from the same planning pass and agrees with auto-fit."""

from __future__ import annotations

import pytest

from pagedkv.config import EngineConfig
from pagedkv.models import describe_model, get_kv_cache_specs
from pagedkv.planning import plan_kv_cache

GiB = 1 << 30


@pytest.mark.parametrize(
    ("model", "memory_gib"),
    [
        ("gemma-3-27b-it", 20),
        ("Llama-3.1-8B", 6),
        ("Jamba-v0.1", 30),
        ("Qwen3-Next-80B-A3B-Instruct", 8),
        ("gpt-oss-20b", 3),
    ],
)
@pytest.mark.parametrize("max_model_len", [4096, 32768])
def test_largest_length_matches_an_auto_fitted_plan(
    model: str, memory_gib: int, max_model_len: int
) -> None:
    layout = describe_model(model)
    config = EngineConfig.create(max_model_len=max_model_len)
    specs = get_kv_cache_specs(layout, config=config)
    available = [memory_gib * GiB] * len(specs)
    limit = 131072
    plan = plan_kv_cache(config, specs, available, max_model_len_limit=limit)
    assert not plan.max_model_len_auto_fitted
    fitted = plan_kv_cache(
        config.replace(max_model_len=-1), specs, available, max_model_len_limit=limit
    )
    assert fitted.max_model_len_auto_fitted
    assert plan.largest_max_model_len == fitted.max_model_len == fitted.largest_max_model_len
    assert plan.largest_max_model_len >= max_model_len
