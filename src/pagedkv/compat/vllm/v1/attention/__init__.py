"""vLLM's ``vllm.v1.attention`` (names only; see ``_outside``)."""
