"""vLLM's ``vllm.v1.core``: the KV cache manager, block pool and planning, over pagedkv."""
