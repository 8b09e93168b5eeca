"""vLLM's ``vllm.v1.engine`` (names only; see ``_outside``)."""
