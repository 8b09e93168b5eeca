"""Planning a simulation's KV cache for a given block count, through the planner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from pagedkv.capacity.report import KVCachePlan
from pagedkv.config import EngineConfig
from pagedkv.errors import InsufficientMemoryError
from pagedkv.specs import KVCacheSpec

__all__ = [
    "PlanInputs",
    "plan_inputs_for",
    "plan_with_num_blocks",
]

if TYPE_CHECKING:
    from pagedkv.models import ModelLayout

# The planner sizes the tensors from ``num_gpu_blocks_override`` and only checks that the
# memory covers them; one GiB per block is more than any block of any bundled model.
_BUDGET_BYTES_PER_BLOCK = 1 << 30


class PlanInputs(NamedTuple):
    """What the planner needs to plan the same model again for another block count.

    ``fixed_max_model_len``: the length was asked for, so a block count too small for one
    such request is an error; otherwise the planner fits the length (``max_model_len=-1``,
    at most ``max_model_len_limit``).
    """

    config: EngineConfig
    kv_cache_specs: tuple[Mapping[str, KVCacheSpec], ...]
    max_model_len_limit: int
    fixed_max_model_len: bool


def plan_inputs_for(
    layout: ModelLayout, config: EngineConfig, *, fixed_max_model_len: bool
) -> PlanInputs:
    """Planning inputs for a described model and its engine config."""
    from pagedkv.config import ModelConfig
    from pagedkv.models import get_kv_cache_specs

    specs = tuple(get_kv_cache_specs(layout, config=config))
    limit = max(layout.max_model_len or ModelConfig().max_model_len, config.max_model_len)
    return PlanInputs(config, specs, limit, fixed_max_model_len)


def plan_with_num_blocks(inputs: PlanInputs, num_blocks: int) -> tuple[KVCachePlan, EngineConfig]:
    """The planner's plan with exactly ``num_blocks`` blocks (``num_gpu_blocks_override``),
    so tensors, block count and ``max_model_len`` agree; and the config it was planned at.

    Raises ``InsufficientMemoryError`` when the length is fixed and one request of it does
    not fit into ``num_blocks - 1`` blocks.
    """
    from pagedkv.capacity import plan_kv_cache

    length = inputs.config.max_model_len if inputs.fixed_max_model_len else -1
    config = inputs.config.replace(num_gpu_blocks_override=num_blocks, max_model_len=length)
    available = [num_blocks * _BUDGET_BYTES_PER_BLOCK] * len(inputs.kv_cache_specs)
    try:
        plan = plan_kv_cache(
            config, inputs.kv_cache_specs, available, max_model_len_limit=inputs.max_model_len_limit
        )
    except InsufficientMemoryError as exc:
        raise InsufficientMemoryError(
            f"{num_blocks} KV cache blocks: {exc} (without an explicit max_model_len the "
            "simulator fits it to the blocks)"
        ) from exc
    return plan, config.replace(max_model_len=plan.max_model_len)
