"""vLLM's ``vllm.v1.attention.backends`` (names only; see ``_outside``)."""
