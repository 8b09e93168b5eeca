"""pagedkv's specs for a transformers model, read from the model's own config."""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedkv.config import EngineConfig
from pagedkv.models import ModelLayout, describe_model, get_kv_cache_specs
from pagedkv.models.source import ModelSource
from pagedkv.specs import KVCacheSpec, MambaSpec

__all__ = [
    "dtype_name",
    "model_layout",
    "kv_cache_specs_for",
]


def dtype_name(model: Any) -> str:
    """The model's parameter dtype as pagedkv names it (``torch.float32`` -> ``float32``)."""
    return str(model.dtype).removeprefix("torch.")


def model_layout(model: Any) -> ModelLayout:
    """pagedkv's adapter's reading of the model's own config, in the model's dtype."""
    raw = model.config.to_dict()
    raw["dtype"] = raw["torch_dtype"] = dtype_name(model)
    _unfold_per_layer_config(raw)
    raw.setdefault("num_hidden_layers", model.config.num_hidden_layers)  # derived in some
    source = ModelSource(str(getattr(model.config, "model_type", "model")), raw)
    return describe_model(source, use_transformers=False)


def kv_cache_specs_for(model: Any, config: EngineConfig) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` from pagedkv's adapter for the model's config (one worker).

    Every cache tensor holds what this model computes: attention pages take the
    config's ``cache_dtype``, and Mamba states the model's dtype (the adapter serves a
    float32 checkpoint's states in bfloat16, as vLLM does; a float32 run keeps float32).
    """
    (specs,) = get_kv_cache_specs(model_layout(model), config=config)
    return {name: _in_model_dtype(spec, dtype_name(model)) for name, spec in specs.items()}


def _unfold_per_layer_config(raw: dict[str, Any]) -> None:
    """transformers folds Gemma 4's ``global_head_dim`` and ``num_global_key_value_heads``
    into ``per_layer_config`` (one override per global layer); the adapter reads the
    published names, so they are put back from the overrides."""
    per_layer = raw.get("per_layer_config")
    if not isinstance(per_layer, dict) or not per_layer:
        return
    first = next(iter(per_layer.values()))
    for name, published in (
        ("head_dim", "global_head_dim"),
        ("num_key_value_heads", "num_global_key_value_heads"),
    ):
        if name in first:
            raw.setdefault(published, first[name])


def _in_model_dtype(spec: KVCacheSpec, dtype: str) -> KVCacheSpec:
    if isinstance(spec, MambaSpec):
        return dataclasses.replace(spec, dtypes=(dtype,) * len(spec.dtypes))
    return spec
