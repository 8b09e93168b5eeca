"""vLLM's ``vllm.model_executor.layers.mamba``."""
