"""vLLM's ``vllm.v1.metrics`` (prefix-cache statistics)."""
