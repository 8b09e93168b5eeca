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
    gather_kv_rows,
    window_for_spec,
    write_kv,
)

__all__ = [
    "ATTENTION_NAME",
    "HFIntegrationError",
    "PagedStep",
    "running_step",
    "layer_index",
    "views_by_layer",
    "current_step",
    "current_view",
    "AttentionOptions",
    "grouped_attention",
    "SHORT_CHUNK_TOKENS",
    "attend_short_chunks",
    "attend_request",
    "paged_attention_forward",
    "MIN_TRANSFORMERS",
    "register_attention",
]

ATTENTION_NAME = "pagedkv"
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class HFIntegrationError(PagedKVError, RuntimeError):
    """A transformers model and pagedkv's plan do not fit together."""


class PagedStep(NamedTuple):
    """What one forward pass reads: each decoder layer's view and each group's metadata.

    ``gathered``: for layers whose cache returned the requests' contexts concatenated
    (MLA latents), each request's ``(start, end)`` in the keys attention receives.
    ``attended``: the decoder layers whose attention called pagedkv in this pass.
    """

    layers: Mapping[int, LayerView]
    metadata: Mapping[int, AttentionMetadata]
    gathered: dict[int, list[tuple[int, int]]]
    attended: set[int]


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
    step.attended.add(index)
    return view, step.metadata[view.group_id]


class AttentionOptions(NamedTuple):
    """What a layer adds to plain softmax attention (transformers' eager arithmetic)."""

    scaling: float
    softcap: float | None = None
    sinks: torch.Tensor | None = None


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor,
    options: AttentionOptions,
) -> torch.Tensor:
    """Query ``[N, T, H, D]`` over key/value ``[N, S, Hk, D]`` where ``visible`` ``[N, T, S]``
    -> ``[N, T, H, Dv]``: query head ``h`` reads key head ``h // (H / Hk)``, as transformers'
    ``repeat_kv`` arranges them, without repeating the keys.

    Args:
        query: queries ``[N, T, H, D]``.
        key: keys ``[N, S, Hk, D]``, cast to the query's dtype.
        value: values ``[N, S, Hk, Dv]``, cast to the query's dtype.
        visible: ``[N, T, S]`` booleans, True where a query sees a key.
        options: the softmax scale, optional logit soft cap and optional attention sinks.
    """
    n, t, heads, dim = query.shape
    kv_heads = key.shape[2]
    rep = heads // kv_heads
    # rows of one key head: (repeat, token), so a row's head is kv_head * rep + repeat
    q = query.reshape(n, t, kv_heads, rep, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, -1, dim)
    k = key.to(query.dtype).transpose(1, 2)
    v = value.to(query.dtype).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-1, -2)) * options.scaling
    if options.softcap is not None:
        scores = torch.tanh(scores / options.softcap) * options.softcap
    mask = visible[:, None, None].expand(n, 1, rep, t, visible.shape[-1]).reshape(n, 1, rep * t, -1)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if options.sinks is not None:
        column = options.sinks.reshape(kv_heads, rep, 1, 1).expand(kv_heads, rep, t, 1)
        column = column.reshape(1, kv_heads, rep * t, 1).expand(n, -1, -1, -1).to(scores.dtype)
        scores = torch.cat([scores, column], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)[..., :-1]
    else:
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, v)  # [N, Hk, rep * T, Dv]
    return out.reshape(n, kv_heads, rep, t, -1).permute(0, 3, 1, 2, 4).reshape(n, t, heads, -1)


# Chunks of at most this many new tokens (decodes, and prefills after a prefix hit) run
# together, padded to the longest; longer prefill chunks run one by one.
SHORT_CHUNK_TOKENS = 64


def attend_short_chunks(
    query: torch.Tensor,
    view: LayerView,
    meta: AttentionMetadata,
    requests: list[int],
    window: AttentionWindow,
    options: AttentionOptions,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Short chunks of several requests at once: every request's keys gathered through its
    block-table row in one indexing operation, padded to the longest, one attention call.

    Returns the outputs ``[N, T, H, Dv]`` and, for each, the row of ``query`` it belongs to
    (``-1`` for padding).

    Args:
        query: the step's packed queries ``[tokens, H, D]``.
        view: the layer's cache tensor and spec.
        meta: the step's attention metadata (query starts, positions, block tables, lengths).
        requests: indices of the requests, in ``meta``, attended together.
        window: the layer's attention window (which keys each position sees).
        options: the softmax scale, optional logit soft cap and optional attention sinks.
    """
    picked = torch.tensor(requests)
    first = meta.query_start_loc[picked].to(torch.int64)
    counts = meta.query_start_loc[picked + 1].to(torch.int64) - first
    steps = torch.arange(int(counts.max()))
    real = steps[None, :] < counts[:, None]
    rows = torch.minimum(first[:, None] + steps[None, :], (first + counts - 1)[:, None])
    q_pos = meta.positions[rows]
    seq_lens = meta.seq_lens[picked].to(torch.int64)
    key_start = window.key_start(q_pos[:, 0])
    num_keys = seq_lens - key_start
    key_steps = torch.arange(int(num_keys.max()))
    k_pos = torch.minimum(key_start[:, None] + key_steps[None, :], (seq_lens - 1)[:, None])
    visible = (
        (key_steps[None, None, :] < num_keys[:, None, None])
        & (k_pos[:, None, :] <= q_pos[:, :, None])
        & (k_pos[:, None, :] >= window.key_start(q_pos)[:, :, None])
    )
    key, value = gather_kv_rows(view, meta.block_table[picked], k_pos)
    out = grouped_attention(query[rows], key, value, visible, options)
    return out, torch.where(real, rows, -1)


def attend_request(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: AttentionWindow,
    options: AttentionOptions,
) -> torch.Tensor:
    """One request's queries ``[T, H, D]`` over its keys/values ``[S, Hk, D]`` at ``k_pos``.

    Args:
        query: the request's queries ``[T, H, D]``.
        key: its keys ``[S, Hk, D]``.
        value: its values ``[S, Hk, Dv]``.
        q_pos: the queries' token positions ``[T]``.
        k_pos: the keys' token positions ``[S]``.
        window: the layer's attention window (which keys each position sees).
        options: the softmax scale, optional logit soft cap and optional attention sinks.
    """
    visible = (k_pos[None, :] <= q_pos[:, None]) & (
        k_pos[None, :] >= window.key_start(q_pos)[:, None]
    )
    return grouped_attention(query[None], key[None], value[None], visible[None], options)[0]


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

    The new K/V is written through the slot mapping. Requests with short chunks (decodes,
    prefills after a prefix hit) read their contexts through their block-table rows
    together, in one gather and one attention call; each longer prefill chunk reads its
    own. For layers whose cache already returned the requests' contexts (MLA),
    ``key/value`` hold them and each request takes its own slice.

    Args:
        module: the attention module (its ``layer_idx`` and ``sinks`` are read).
        query: ``[1, H, T, D]`` queries of the step's packed new tokens.
        key: ``[1, Hk, T, D]`` keys of the new tokens, or every request's latent context (MLA).
        value: ``[1, Hk, T, Dv]`` values of the new tokens, or the latent context (MLA).
        attention_mask: transformers' mask, unused: visibility comes from positions and windows.
        scaling: the softmax scale (None: ``D ** -0.5``).
        dropout: unused (no dropout at inference).
    """
    view, meta = current_view(module)
    spans = current_step().gathered.get(int(getattr(module, "layer_idx", -1)))
    q = query[0].transpose(0, 1)
    if spans is None:
        write_kv(view, meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    options = AttentionOptions(
        query.shape[-1] ** -0.5 if scaling is None else scaling,
        kwargs.get("softcap"),
        getattr(module, "sinks", None),
    )
    window = window_for_spec(view.spec)
    out = q.new_empty((q.shape[0], q.shape[1], value.shape[-1]))
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    sizes = [starts[i + 1] - starts[i] for i in range(len(seq_lens))]
    short = [i for i, n in enumerate(sizes) if n <= SHORT_CHUNK_TOKENS and spans is None]
    if short:
        batched, rows = attend_short_chunks(q, view, meta, short, window, options)
        real = rows >= 0
        out[rows[real]] = batched[real]
    batched_requests = set(short)
    for i in (i for i in range(len(seq_lens)) if i not in batched_requests):
        rows_i = slice(starts[i], starts[i + 1])
        q_pos = meta.positions[rows_i]
        if spans is None:
            k_pos = torch.arange(int(window.key_start(q_pos[:1])[0]), seq_lens[i])
            k, v = gather_kv(view, meta.block_table[i], k_pos)
        else:
            k_pos = torch.arange(seq_lens[i])
            k = key[0, :, spans[i][0] : spans[i][1]].transpose(0, 1)
            v = value[0, :, spans[i][0] : spans[i][1]].transpose(0, 1)
        out[rows_i] = attend_request(q[rows_i], k, v, q_pos, k_pos, window, options)
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
