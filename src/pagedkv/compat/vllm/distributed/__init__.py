"""vLLM's ``vllm.distributed`` (KV events and the connector names)."""
