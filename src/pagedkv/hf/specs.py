"""pagedkv's specs for a transformers model, read from the model's own config."""

from __future__ import annotations

from typing import Any

from pagedkv.config import EngineConfig
from pagedkv.models import get_kv_cache_specs
from pagedkv.models.source import ModelSource
from pagedkv.specs import KVCacheSpec


def dtype_name(model: Any) -> str:
    """The model's parameter dtype as pagedkv names it (``torch.float32`` -> ``float32``)."""
    return str(model.dtype).removeprefix("torch.")


def kv_cache_specs_for(model: Any, config: EngineConfig) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` from pagedkv's adapter for the model's config (one worker),
    every cache tensor in the dtype the model computes in."""
    raw = model.config.to_dict()
    raw["dtype"] = raw["torch_dtype"] = dtype_name(model)
    source = ModelSource(str(getattr(model.config, "model_type", "model")), raw)
    (specs,) = get_kv_cache_specs(source, config=config, use_transformers=False)
    return specs
