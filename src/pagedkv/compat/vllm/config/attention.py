"""vLLM's ``vllm.config.attention``."""

from __future__ import annotations

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["AttentionConfig", "HiSparseConfig"]


class HiSparseConfig(ConfigPart):
    DEFAULTS = {"enabled": False, "host_num_blocks": None}


class AttentionConfig(ConfigPart):
    DEFAULTS = {"backend": None, "hisparse_config": None}
