"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1`` (names only; see ``_outside``)."""
