"""vLLM's ``vllm.v1.attention.backends.utils`` (the KV cache layout choice)."""

from __future__ import annotations

from pagedkv.platforms import get_current_platform

__all__ = ["resolve_kv_cache_layout"]


def resolve_kv_cache_layout() -> str:
    """The platform's default per-block layout of attention pages."""
    return get_current_platform().default_kv_cache_layout()
