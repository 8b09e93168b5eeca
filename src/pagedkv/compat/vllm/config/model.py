"""vLLM's ``vllm.config.model``: the model's length limit and dtype (no Hub access)."""

from __future__ import annotations

from typing import Any, Literal

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["ModelConfig", "RunnerOption"]

RunnerOption = Literal["auto", "generate", "pooling", "draft"]


class ModelConfig(ConfigPart):
    """The model's settings by keyword (``model`` may come first, as in vLLM); nothing is
    read from the Hub, so a field vLLM derives from the model's config is as given."""

    DEFAULTS = {
        "model": None,
        "runner": "auto",
        "max_model_len": 8192,
        "dtype": "bfloat16",
        "is_attention_free": False,
        "is_encoder_decoder": False,
        "use_mla": False,
    }

    def __init__(self, model: str | None = None, **fields: Any) -> None:
        super().__init__(model=model, **fields)
