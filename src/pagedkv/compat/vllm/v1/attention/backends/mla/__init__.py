"""vLLM's ``vllm.v1.attention.backends.mla`` (names only; see ``_outside``)."""
