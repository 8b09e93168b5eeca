"""vLLM's ``vllm.utils`` helpers the KV cache layer uses."""
