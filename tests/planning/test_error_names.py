"""A bad argument's error names the function the caller called."""

from __future__ import annotations

import pytest

from pagedkv import EngineConfig, PlanningError, plan_kv_cache
from pagedkv.capacity import concurrency_points
from pagedkv.planning import plan_kv_cache_configs

from .models import GiB, llama_8b


@pytest.mark.parametrize("limit", [0, -5, 1.5])
def test_max_model_len_limit_error_names_the_called_function(limit: object) -> None:
    config, specs = EngineConfig.create(max_model_len=4096), [llama_8b(1)]
    with pytest.raises(PlanningError, match=r"^plan_kv_cache\.max_model_len_limit must"):
        plan_kv_cache(config, specs, [GiB], max_model_len_limit=limit)  # type: ignore[arg-type]
    with pytest.raises(PlanningError, match=r"^plan_kv_cache_configs\.max_model_len_limit"):
        plan_kv_cache_configs(config, specs, [GiB], max_model_len_limit=limit)  # type: ignore[arg-type]


def test_context_lengths_error_names_the_called_function() -> None:
    config, specs = EngineConfig.create(max_model_len=4096), [llama_8b(1)]
    with pytest.raises(PlanningError, match=r"^plan_kv_cache\.context_lengths must"):
        plan_kv_cache(config, specs, [GiB], context_lengths=[0])
    plan = plan_kv_cache(config, specs, [GiB])
    with pytest.raises(PlanningError, match=r"^concurrency_points\.context_lengths must"):
        concurrency_points(plan, [-1])
