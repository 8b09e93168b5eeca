"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.moriio`` (names only; see ``_outside``)."""
