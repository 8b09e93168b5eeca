"""Real memory for a plan (needs the torch extra): buffers, per-layer views, block tables,
slot mappings and a reference paged attention."""

from pagedkv.tensors.allocation import KVCacheMemory, allocate_kv_cache, blocks_that_fit
from pagedkv.tensors.attention import (
    AttentionWindow,
    attend,
    block_size_of,
    gather_kv,
    gather_kv_rows,
    paged_attention,
    window_for_spec,
    write_kv,
)
from pagedkv.tensors.check import (
    CheckReport,
    CheckStalledError,
    PagedAttentionMismatch,
    check_paged_attention,
)
from pagedkv.tensors.content import TokenContent
from pagedkv.tensors.dtypes import torch_dtype
from pagedkv.tensors.errors import BlockTableError, TensorLayoutError
from pagedkv.tensors.metadata import (
    PAD_BLOCK_ID,
    AttentionMetadata,
    ScheduledRequest,
    block_table_tensor,
    build_attention_metadata,
    slot_mapping,
)
from pagedkv.tensors.overlap import UnsafeOverlap, find_unsafe_overlaps
from pagedkv.tensors.views import LayerView, ViewRequest, page_order, register_view_builder
from pagedkv.tensors.workload import MiniScheduler, WorkloadRequest, random_workload

__all__ = [
    "PAD_BLOCK_ID",
    "AttentionMetadata",
    "AttentionWindow",
    "BlockTableError",
    "CheckReport",
    "CheckStalledError",
    "KVCacheMemory",
    "LayerView",
    "MiniScheduler",
    "PagedAttentionMismatch",
    "ScheduledRequest",
    "TensorLayoutError",
    "TokenContent",
    "UnsafeOverlap",
    "ViewRequest",
    "WorkloadRequest",
    "allocate_kv_cache",
    "attend",
    "block_size_of",
    "block_table_tensor",
    "blocks_that_fit",
    "build_attention_metadata",
    "check_paged_attention",
    "find_unsafe_overlaps",
    "gather_kv",
    "gather_kv_rows",
    "page_order",
    "paged_attention",
    "random_workload",
    "register_view_builder",
    "slot_mapping",
    "torch_dtype",
    "window_for_spec",
    "write_kv",
]
