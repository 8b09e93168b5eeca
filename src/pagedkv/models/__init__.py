"""Model configs to KV cache specs: adapters, bundled configs, weights and the GPU table."""

from pagedkv.models.adapters import (
    ModelAdapter,
    describe_model,
    register_model_adapter,
    registered_adapter_names,
    unregister_model_adapter,
)
from pagedkv.models.gpus import GPU, get_gpu, list_gpus
from pagedkv.models.layers import (
    AttentionLayer,
    LatentLayer,
    ModelLayout,
    StateLayer,
    StateShape,
    Unit,
    layer_spec,
)
from pagedkv.models.source import ConfigView, ModelSource, list_bundled_models, load_model_config
from pagedkv.models.states import GatedDeltaNetState, Mamba1State, Mamba2State
from pagedkv.models.workers import (
    MemoryBudget,
    activation_reserve_bytes,
    engine_config_for,
    estimate_weight_bytes,
    get_kv_cache_specs,
    memory_budgets,
    pipeline_stages,
    weight_bytes_per_worker,
)

__all__ = [
    "GPU",
    "AttentionLayer",
    "ConfigView",
    "GatedDeltaNetState",
    "LatentLayer",
    "Mamba1State",
    "Mamba2State",
    "MemoryBudget",
    "ModelAdapter",
    "ModelLayout",
    "ModelSource",
    "StateLayer",
    "StateShape",
    "Unit",
    "activation_reserve_bytes",
    "describe_model",
    "engine_config_for",
    "estimate_weight_bytes",
    "get_gpu",
    "get_kv_cache_specs",
    "layer_spec",
    "list_bundled_models",
    "list_gpus",
    "load_model_config",
    "memory_budgets",
    "pipeline_stages",
    "register_model_adapter",
    "registered_adapter_names",
    "unregister_model_adapter",
    "weight_bytes_per_worker",
]
