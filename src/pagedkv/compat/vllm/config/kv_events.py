"""vLLM's ``vllm.config.kv_events``: pagedkv's publisher settings, vLLM's field names."""

from pagedkv.events.config import KVEventsConfig

__all__ = ["KVEventsConfig"]
