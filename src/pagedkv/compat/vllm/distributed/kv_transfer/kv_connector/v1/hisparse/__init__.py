"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.hisparse`` (names only; see ``_outside``)."""
