"""vLLM's ``vllm.config.model``: the model's length limit and dtype (no Hub access)."""

from __future__ import annotations

from typing import Literal

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["ModelConfig", "RunnerOption"]

RunnerOption = Literal["auto", "generate", "pooling", "draft"]


class ModelConfig(ConfigPart):
    DEFAULTS = {
        "model": None,
        "max_model_len": 8192,
        "dtype": "bfloat16",
        "is_attention_free": False,
        "use_mla": False,
    }
