"""vLLM's ``vllm.envs`` settings the KV cache layer reads, from the environment."""

from __future__ import annotations

import os

__all__ = ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "VLLM_TARGET_DEVICE"]

VLLM_TARGET_DEVICE = os.environ.get("VLLM_TARGET_DEVICE", "cpu")
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = os.environ.get(
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0"
) not in ("0", "", "false", "False")
VLLM_USE_V1 = True
VLLM_ENABLE_V1_MULTIPROCESSING = False
