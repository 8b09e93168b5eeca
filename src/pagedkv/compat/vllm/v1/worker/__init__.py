"""vLLM's ``vllm.v1.worker`` (names only; see ``_outside``)."""
