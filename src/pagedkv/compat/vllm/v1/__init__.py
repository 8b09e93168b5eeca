"""vLLM's ``vllm.v1`` package, as far as the KV cache layer reaches."""
