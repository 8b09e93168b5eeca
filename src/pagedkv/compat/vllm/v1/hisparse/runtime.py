"""Names from vLLM's ``vllm.v1.hisparse.runtime``: the host pool's geometry (whether
replicated workers share one host mapping, its block stride) over pagedkv's HiSparse
planning. The data plane (pinned buffers, copy streams, kernels) is vLLM's worker side,
outside the KV cache layer."""

from __future__ import annotations

import mmap
from typing import Any

from pagedkv.compat.vllm.platforms import current_platform
from pagedkv.specs.base import cdiv

__all__ = [
    "current_platform",
    "get_hisparse_host_block_stride",
    "hisparse_host_block_alignment",
    "use_shared_hisparse_host_pool",
]

# A shared host mapping places each block on an OS page boundary.
_SHARED_POOL_ALIGNMENT_BYTES = mmap.PAGESIZE


def use_shared_hisparse_host_pool(vllm_config: Any) -> bool:
    """Whether tensor-parallel workers on one node, each holding the same MLA host KV,
    can share one host mapping (CUDA-like platform, TP only, multiprocessing)."""
    parallel = vllm_config.parallel_config
    return bool(
        current_platform.is_cuda_alike()
        and parallel.tensor_parallel_size > 1
        and parallel.pipeline_parallel_size == 1
        and parallel.prefill_context_parallel_size == 1
        and parallel.decode_context_parallel_size == 1
        and parallel.world_size == parallel.tensor_parallel_size
        and parallel.distributed_executor_backend == "mp"
        and parallel.nnodes_within_dp == 1
    )


def hisparse_host_block_alignment(*, use_shared_host_pool: bool) -> int:
    """Bytes host blocks are aligned to: an OS page in a shared mapping, else 1."""
    return _SHARED_POOL_ALIGNMENT_BYTES if use_shared_host_pool else 1


def get_hisparse_host_block_stride(page_size_bytes: int, *, use_shared_host_pool: bool) -> int:
    """Bytes between host blocks: the page, OS-page aligned in a shared mapping."""
    alignment = hisparse_host_block_alignment(use_shared_host_pool=use_shared_host_pool)
    return cdiv(page_size_bytes, alignment) * alignment
