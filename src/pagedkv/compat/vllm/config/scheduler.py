"""vLLM's ``vllm.config.scheduler``."""

from __future__ import annotations

from typing import Literal

from pagedkv.compat.vllm.config._base import ConfigPart

__all__ = ["SchedulerConfig", "SchedulerPolicy"]

SchedulerPolicy = Literal["fcfs", "priority"]


class SchedulerConfig(ConfigPart):
    DEFAULTS = {
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
        "max_model_len": 8192,
        "async_scheduling": False,
        "enable_chunked_prefill": True,
        "max_num_encoder_input_tokens": 8192,
        "policy": "fcfs",
    }
