"""vLLM's ``vllm.v1.core.sched.output``: vLLM's scheduler, outside the KV cache layer (importable;
using a name raises ``OutsideKVCacheLayerError``)."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["SchedulerOutput"]

SchedulerOutput = outside_class("SchedulerOutput", "scheduler", __name__)
