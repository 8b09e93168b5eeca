"""vLLM's ``vllm.model_executor``."""
