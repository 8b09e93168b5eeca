"""Weight memory per worker, estimated from the config's parameter count and dtype."""

from __future__ import annotations

from pagedkv.dtypes import dtype_size
from pagedkv.models.build import ModelLike, _as_layout, pipeline_stages
from pagedkv.models.layers import ModelLayout

# Bits per weight of quantised linear layers, scales included (mxfp4: 1 scale byte per 32).
_QUANT_BITS = {"fp8": 8.0, "fbgemm_fp8": 8.0, "mxfp4": 4.25, "awq": 4.25, "gptq": 4.25}
# Formats that quantise only the MoE experts.
_EXPERTS_ONLY = {"mxfp4"}


def bytes_per_param(layout: ModelLayout) -> tuple[float, float]:
    """(dense linear, expert) bytes per parameter."""
    base = float(dtype_size(layout.dtype))
    bits = _QUANT_BITS.get(layout.quant_method or "")
    if bits is None:
        return base, base
    quant = bits / 8
    return (base if layout.quant_method in _EXPERTS_ONLY else quant), quant


def weight_bytes_per_worker(
    model: ModelLike | ModelLayout, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> list[int]:
    """Estimated weight bytes on each worker (pp-major).

    Every stage holds its layers, the first also the embedding (and encoder), the
    last the output head; tensor parallelism divides each stage evenly. Norms,
    biases and vision towers are not counted, unless the checkpoint's index states
    its total size: then the split is scaled to that total.
    """
    layout = _as_layout(model, None)
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    dense, expert = bytes_per_param(layout)
    base = dtype_size(layout.dtype)
    out: list[int] = []
    stages = pipeline_stages(layout, pp)
    for rank, units in enumerate(stages):
        total = sum(u.params * dense + u.expert_params * expert for u in units)
        if rank == 0:
            total += layout.embedding_params * base + layout.encoder_params * dense
        if rank == len(stages) - 1:
            total += layout.head_params * base
        out.extend([int(-(-total // tp))] * tp)
    estimated = sum(out)
    if layout.checkpoint_bytes and estimated:
        scale = layout.checkpoint_bytes / estimated
        out = [int(-(-(w * scale) // 1)) for w in out]
    return out


def estimate_weight_bytes(
    model: ModelLike | ModelLayout, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> int:
    """Weight bytes of the most loaded worker (what its memory budget must hold)."""
    return max(weight_bytes_per_worker(model, tensor_parallel_size, pipeline_parallel_size))
