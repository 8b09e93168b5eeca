"""vLLM's ``vllm.config.speculative``."""

from __future__ import annotations

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["SpeculativeConfig"]


class SpeculativeConfig(ConfigPart):
    DEFAULTS = {"method": None, "num_speculative_tokens": 0, "model": None}

    def use_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp")
