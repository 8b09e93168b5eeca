"""The attention function transformers calls: write the new K/V through the slot
mapping into pagedkv's per-layer views, then attend through the block table.

Registered with ``transformers.AttentionInterface`` under :data:`ATTENTION_NAME`; a
model built with ``attn_implementation=ATTENTION_NAME`` (or switched with
``model.set_attn_implementation``) calls :func:`paged_attention_forward` from each of
its attention modules, which finds the step being run through :func:`running_step`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, NamedTuple

import torch

from pagedkv.errors import PagedKVError
from pagedkv.tensors import (
    AttentionMetadata,
    AttentionWindow,
    LayerView,
    gather_kv,
    window_for_spec,
    write_kv,
)

ATTENTION_NAME = "pagedkv"
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class HFIntegrationError(PagedKVError, RuntimeError):
    """A transformers model and pagedkv's plan do not fit together."""


class PagedStep(NamedTuple):
    """What one forward pass reads: each decoder layer's view and each group's metadata.

    ``gathered``: for layers whose cache returned the requests' contexts concatenated
    (MLA latents), each request's ``(start, end)`` in the keys attention receives.
    """

    layers: Mapping[int, LayerView]
    metadata: Mapping[int, AttentionMetadata]
    gathered: dict[int, list[tuple[int, int]]]


_STEP: ContextVar[PagedStep | None] = ContextVar("pagedkv_hf_step", default=None)


@contextlib.contextmanager
def running_step(step: PagedStep) -> Iterator[None]:
    token = _STEP.set(step)
    try:
        yield
    finally:
        _STEP.reset(token)


def layer_index(layer_name: str) -> int:
    """Decoder layer index of a spec's layer name (``model.layers.3.self_attn`` -> 3)."""
    match = _LAYER_INDEX.search(layer_name)
    if match is None:
        raise HFIntegrationError(f"layer {layer_name!r} has no 'layers.<index>.' in its name")
    return int(match.group(1))


def views_by_layer(views: Mapping[str, LayerView]) -> dict[int, LayerView]:
    """Each decoder layer's one cache view, by layer index."""
    by_index: dict[int, LayerView] = {}
    for name, view in views.items():
        index = layer_index(name)
        other = by_index.setdefault(index, view)
        if other is not view:
            raise HFIntegrationError(
                f"decoder layer {index} has two cache layers ({other.layer_name!r}, {name!r}); "
                "pagedkv.hf maps one per layer (sparse-attention indexer keys are not wired)"
            )
    return by_index


def current_step() -> PagedStep:
    step = _STEP.get()
    if step is None:
        raise HFIntegrationError(
            f"attn_implementation={ATTENTION_NAME!r} called outside a pagedkv step"
        )
    return step


def current_view(module: torch.nn.Module) -> tuple[LayerView, AttentionMetadata]:
    step = current_step()
    index = int(getattr(module, "layer_idx", -1))
    view = step.layers.get(index)
    if view is None:
        raise HFIntegrationError(f"decoder layer {index} has no KV cache layer in the plan")
    return view, step.metadata[view.group_id]


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor,
    scaling: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Query ``[H, T, D]``, key/value ``[H, S, D]`` (heads already repeated), ``visible``
    ``[T, S]`` -> ``[T, H, Dv]``; the arithmetic of transformers' eager attention."""
    scores = torch.matmul(query, key.transpose(1, 2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    if sinks is not None:
        column = sinks.reshape(-1, 1, 1).expand(-1, scores.shape[1], 1).to(scores.dtype)
        scores = torch.cat([scores, column], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)[..., :-1]
    else:
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value).transpose(0, 1)


def attend_request(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: AttentionWindow,
    **options: Any,
) -> torch.Tensor:
    """One request's queries ``[T, H, D]`` over its keys/values ``[S, Hk, D]`` at ``k_pos``."""
    repeat = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(repeat, dim=1).transpose(0, 1).to(query.dtype)
    value = value.repeat_interleave(repeat, dim=1).transpose(0, 1).to(query.dtype)
    visible = (k_pos[None, :] <= q_pos[:, None]) & (
        k_pos[None, :] >= window.key_start(q_pos)[:, None]
    )
    return masked_attention(query.transpose(0, 1), key, value, visible, **options)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query [1, H, T, D]`` for the step's packed new
    tokens, ``key/value [1, Hk, T, D]`` for the same tokens -> ``[1, T, H, Dv]``.

    The new K/V is written through the slot mapping and each request's context is read
    back through its block table; for layers whose cache already returned the requests'
    contexts (MLA), ``key/value`` hold them and each request takes its own slice.
    """
    view, meta = current_view(module)
    spans = current_step().gathered.get(int(getattr(module, "layer_idx", -1)))
    q = query[0].transpose(0, 1)
    if spans is None:
        write_kv(view, meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    options = {
        "scaling": query.shape[-1] ** -0.5 if scaling is None else scaling,
        "softcap": kwargs.get("softcap"),
        "sinks": getattr(module, "sinks", None),
    }
    window = window_for_spec(view.spec)
    out = q.new_empty((q.shape[0], q.shape[1], value.shape[-1]))
    starts = meta.query_start_loc.tolist()
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        rows = slice(starts[i], starts[i + 1])
        q_pos = meta.positions[rows]
        if spans is None:
            k_pos = torch.arange(int(window.key_start(q_pos[:1])[0]), seq_len)
            k, v = gather_kv(view, meta.block_table[i], k_pos)
        else:
            k_pos = torch.arange(seq_len)
            k = key[0, :, spans[i][0] : spans[i][1]].transpose(0, 1)
            v = value[0, :, spans[i][0] : spans[i][1]].transpose(0, 1)
        out[rows] = attend_request(q[rows], k, v, q_pos, k_pos, window, **options)
    return out[None], None


MIN_TRANSFORMERS = "5.24"  # the version pagedkv.hf is tested with (the ``cache`` keyword)


def register_attention() -> None:
    """Make ``attn_implementation="pagedkv"`` known to transformers (idempotent)."""
    import transformers
    from packaging.version import Version
    from transformers import AttentionInterface

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise HFIntegrationError(
            f"pagedkv.hf needs transformers >= {MIN_TRANSFORMERS} (layers take the KV cache "
            f"as the `cache` keyword there); found {transformers.__version__}"
        )

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
