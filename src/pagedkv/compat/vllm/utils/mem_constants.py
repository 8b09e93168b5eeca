"""vLLM's ``vllm.utils.mem_constants``."""

__all__ = ["GiB_bytes", "MiB_bytes"]

MiB_bytes = 1 << 20
GiB_bytes = 1 << 30
