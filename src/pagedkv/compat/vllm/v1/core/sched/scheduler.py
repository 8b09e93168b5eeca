"""Names from vLLM's ``vllm.v1.core.sched.scheduler``.

vLLM's scheduler, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["Scheduler", "SchedulerOutput"]

Scheduler = outside_class("Scheduler", "scheduler", __name__)
from pagedkv.compat.vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
