"""Names from vLLM's ``vllm.v1.core.sched.async_scheduler``.

vLLM's scheduler, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["AsyncScheduler"]

AsyncScheduler = outside_class("AsyncScheduler", "scheduler", __name__)
