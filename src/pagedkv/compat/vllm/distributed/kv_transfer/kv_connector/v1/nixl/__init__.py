"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.nixl`` (names only; see ``_outside``)."""
