"""Names from vLLM's ``vllm.v1.hisparse.types``: pagedkv's host-tier transfer types
(``pagedkv.runtime.hisparse``) under vLLM's names."""

from pagedkv.runtime.hisparse import OffloadCommand, PageTransfer, ResidencyUpdate, RowMirror

__all__ = [
    "SparseKVOffloadCommand",
    "SparseKVPageTransfer",
    "SparseKVResidencyUpdate",
    "SparseKVRowMirror",
]

SparseKVPageTransfer = PageTransfer
SparseKVRowMirror = RowMirror
SparseKVResidencyUpdate = ResidencyUpdate
SparseKVOffloadCommand = OffloadCommand
