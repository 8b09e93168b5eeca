"""The gated-DeltaNet prefill kernel vLLM 0.33 runs on a GPU.

vLLM resolves it per device when it builds the layers: FlashInfer's on Hopper
(compute capability 9.0), and on Blackwell (10.x, 12.x) for 128-wide key heads with
a CUDA 13 runtime; not FlashInfer's anywhere else (Triton/FLA on Ampere and Ada; other
vendors have kernels of their own, such as SYCL's on Intel XPUs and AITER's on some
AMD GPUs). The choice reaches the KV cache: only FlashInfer's kernel emits states inside
a prefill, so only it gives gated-DeltaNet specs their align-mode checkpoint (its
64-token step also rounds a hybrid model's block size).
"""

from __future__ import annotations

from pagedkv.models.gpus import GPU
from pagedkv.models.layers import ModelLayout, StateLayer
from pagedkv.models.states import GatedDeltaNetState

__all__ = ["VLLM_CUDA_RUNTIME_MAJOR", "gdn_key_head_dim", "gdn_prefill_kernel"]

# The CUDA runtime vLLM 0.33's kernels are built for (its bundled Blackwell kernels need a
# CUDA 13 toolkit); the Blackwell rule reads it.
VLLM_CUDA_RUNTIME_MAJOR = 13


def gdn_key_head_dim(layout: ModelLayout) -> int | None:
    """The model's gated-DeltaNet key head width (None: no gated-DeltaNet layer)."""
    for layer in layout.layers:
        if isinstance(layer, StateLayer) and isinstance(layer.state, GatedDeltaNetState):
            return layer.state.key_head_dim
    return None


def gdn_prefill_kernel(
    gpu: GPU, key_head_dim: int | None, cuda_runtime_major: int = VLLM_CUDA_RUNTIME_MAJOR
) -> str:
    """The kernel vLLM 0.33's ``gdn_prefill_backend`` "auto" resolves to on ``gpu``: a
    name in ``pagedkv.config.GDN_PREFILL_KERNELS``; "triton" stands for every kernel
    that is not FlashInfer's off NVIDIA GPUs (the KV cache tells only FlashInfer's apart)."""
    capability = gpu.compute_capability
    if capability is None:  # not CUDA: ROCm, TPU, Gaudi, ...
        return "triton"
    major = capability[0]
    if capability == (9, 0):
        return "flashinfer"
    if major in (10, 12) and key_head_dim == 128 and cuda_runtime_major >= 13:
        return "flashinfer"
    return "triton"
