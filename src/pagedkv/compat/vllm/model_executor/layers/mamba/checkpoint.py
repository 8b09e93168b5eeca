"""vLLM's ``vllm.model_executor.layers.mamba.checkpoint``: prefill checkpoints, from
pagedkv's Mamba spec module when it has them."""

from __future__ import annotations

from typing import Any

from pagedkv.specs import mamba as _mamba

__all__ = ["compute_mamba_prefill_checkpoints"]


def compute_mamba_prefill_checkpoints(*args: Any, **kwargs: Any) -> Any:
    core = getattr(_mamba, "compute_mamba_prefill_checkpoints", None)
    if core is None:
        raise NotImplementedError("Mamba prefill checkpoints need pagedkv's checkpoint support")
    return core(*args, **kwargs)
