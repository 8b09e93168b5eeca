"""vLLM's ``vllm.v1.core.sched`` (names only; see ``_outside``)."""
