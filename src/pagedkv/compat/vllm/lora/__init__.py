"""vLLM's ``vllm.lora`` (the request only)."""
