"""vLLM's ``vllm.distributed.kv_transfer.kv_connector`` (names only; see ``_outside``)."""
