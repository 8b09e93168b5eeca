"""vLLM's ``vllm.multimodal`` (the inputs the block hashes read)."""
