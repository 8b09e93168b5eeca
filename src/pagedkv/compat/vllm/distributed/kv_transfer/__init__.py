"""vLLM's ``vllm.distributed.kv_transfer`` (names only; see ``_outside``)."""
