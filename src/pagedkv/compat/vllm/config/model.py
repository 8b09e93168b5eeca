"""vLLM's ``vllm.config.model``: the model's length limit and dtype (no Hub access)."""

from __future__ import annotations

from typing import Any, Literal

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["ModelConfig", "RunnerOption"]

RunnerOption = Literal["auto", "generate", "pooling", "draft"]


class ModelConfig(ConfigPart):
    """vLLM's fields by keyword (``model`` may come first, as in vLLM); nothing is read
    from the Hub. ``original_max_model_len == -1`` asks planning to auto-fit."""

    DEFAULTS = {
        "model": None,
        "runner": "auto",
        "max_model_len": 8192,
        "original_max_model_len": None,
        "dtype": "bfloat16",
        "is_attention_free": False,
        "is_encoder_decoder": False,
        "use_mla": False,
        "supports_kv_cache_grouping": False,
    }

    def __init__(self, model: str | None = None, **fields: Any) -> None:
        super().__init__(model=model, **fields)
