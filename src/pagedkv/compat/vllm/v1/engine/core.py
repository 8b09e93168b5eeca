"""vLLM's ``vllm.v1.engine.core``: vLLM's engine core, outside the KV cache layer (importable;
constructing one raises ``OutsideKVCacheLayerError``). The one step of its start-up that
reads the KV cache manager, the effective attention block size, is translated."""

from __future__ import annotations

from typing import Any

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["EngineCore"]


_Outside: Any = outside_class("EngineCore", "engine core", __name__)


class EngineCore(_Outside):
    vllm_config: Any
    scheduler: Any

    def _initialize_effective_attention_block_size(self) -> None:
        """``cache_config.effective_attention_block_size``: the block size every full
        attention group's manager uses (tokens per block, DCP included), or None when they
        differ or there is no KV cache manager."""
        from pagedkv.compat.vllm.v1.kv_cache_interface import is_full_attention_spec

        cache_config = self.vllm_config.cache_config
        cache_config.effective_attention_block_size = None
        manager = getattr(self.scheduler, "kv_cache_manager", None)
        if manager is None:
            return
        sizes = {
            m.block_size
            for m in manager.coordinator.single_type_managers
            if is_full_attention_spec(m.kv_cache_spec)
        }
        cache_config.effective_attention_block_size = sizes.pop() if len(sizes) == 1 else None
