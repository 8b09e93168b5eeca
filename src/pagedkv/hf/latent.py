"""MLA (DeepSeek-V2/V3): the latent cache lives in pagedkv's ``latent`` views.

transformers' DeepSeek attention hands its cache the compressed latent (normalized
``kv_nope`` and rotated ``k_rot``) before expanding it into per-head keys and values.
:func:`latent_update` writes each new token's latent (``kv_lora_rank +
qk_rope_head_dim`` values, the spec's head size) at its slot and returns every
scheduled request's latent context read back through the block table, concatenated;
:func:`pagedkv.hf.attention.paged_attention_forward` then attends each request's
queries to its own slice of the expanded keys.
"""

from __future__ import annotations

import torch

from pagedkv.hf.attention import PagedStep
from pagedkv.tensors import LayerView, gather_kv, write_kv

__all__ = [
    "latent_update",
]


def latent_update(
    step: PagedStep, view: LayerView, layer_idx: int, kv_nope: torch.Tensor, k_rot: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Store the new latents; return the requests' latent contexts ``[1, 1, S, rank]``
    and ``[1, 1, S, rope]``, recording each request's span in ``step.gathered``.

    Args:
        step: the running step (metadata by group, gathered spans).
        view: the MLA layer's cache view.
        layer_idx: the layer's index in the model.
        kv_nope: the new tokens' compressed latents ``[1, 1, T, rank]``.
        k_rot: the new tokens' rotary keys ``[1, 1, T, rope]``.
    """
    meta = step.metadata[view.group_id]
    rank = kv_nope.shape[-1]
    write_kv(view, meta.slot_mapping, torch.cat([kv_nope[0, 0], k_rot[0, 0]], dim=-1))
    parts, spans, start = [], [], 0
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        latent, _ = gather_kv(view, meta.block_table[i], torch.arange(seq_len))
        parts.append(latent[:, 0])
        spans.append((start, start + seq_len))
        start += seq_len
    step.gathered[layer_idx] = spans
    context = torch.cat(parts).to(kv_nope.dtype)[None, None]
    return context[..., :rank], context[..., rank:]
