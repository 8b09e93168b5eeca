"""vLLM's ``vllm.v1.hisparse`` (names only; see ``_outside``)."""
