"""The end-to-end check: real block management against dense attention.

A :class:`MiniScheduler` drives the real ``KVCacheManager`` through a workload; every
step writes each scheduled token's K/V through the slot mapping into real tensors laid
out from the plan, runs the reference paged attention for every layer through the block
tables, and compares each query's output with dense attention over that request's own
full K/V history (masked to the layer's window or chunk). Any wrong block id, lost
cache hit, early window free or two groups writing one block shows up as a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.runtime import KVCacheManager
from pagedkv.specs import CrossAttentionSpec
from pagedkv.tensors.allocation import KVCacheMemory, allocate_kv_cache
from pagedkv.tensors.attention import attend, paged_attention, window_for_spec, write_kv
from pagedkv.tensors.content import TokenContent
from pagedkv.tensors.metadata import AttentionMetadata, ScheduledRequest, build_attention_metadata
from pagedkv.tensors.views import LayerView
from pagedkv.tensors.workload import MiniScheduler, ScheduledChunk, WorkloadRequest

__all__ = [
    "PagedAttentionMismatch",
    "CheckStalledError",
    "CheckReport",
    "AttentionFn",
    "check_paged_attention",
]


class PagedAttentionMismatch(PagedKVError, AssertionError):
    """Paged attention over the managed cache disagreed with dense attention."""


class CheckStalledError(PagedKVError, RuntimeError):
    """The workload did not finish within the step limit."""


@dataclass(frozen=True)
class CheckReport:
    """What one check ran: steps, requests, tokens, cache hits, preemptions, block-table
    null entries seen, attention comparisons made, layers checked and the worst error."""

    num_steps: int
    num_requests: int
    num_scheduled_tokens: int
    num_hit_tokens: int
    num_preemptions: int
    num_null_table_entries: int  # summed over steps: blocks freed or skipped (windows)
    num_attention_checks: int
    layers_checked: tuple[str, ...]
    max_abs_error: float


def _attention_layers(memory: KVCacheMemory) -> dict[str, LayerView]:
    """Self-attention layers (cross attention keys come from the encoder, not tokens)."""
    return {
        n: v
        for n, v in memory.layers.items()
        if v.layout in ("NHD", "HND", "latent") and not isinstance(v.spec, CrossAttentionSpec)
    }


def _row_shape(view: LayerView) -> tuple[int, ...]:
    """One token's K (or latent) shape: ``(heads, head)``, or ``(head,)`` for a latent."""
    shape = view.tensor.shape
    if view.layout == "latent":
        return (int(shape[2]),)
    heads = shape[3] if view.layout == "NHD" else shape[2]
    return int(heads), int(shape[4])


def _content(views: dict[str, LayerView], salt: int) -> TokenContent:
    shapes = {}
    for name, view in views.items():
        row = _row_shape(view)
        shapes[name] = (row,) if view.layout == "latent" else (row, row)
    return TokenContent(shapes, {n: v.tensor.dtype for n, v in views.items()}, salt=salt)


# (view, query [T, Hq, D], metadata, *, value_head_size, compute_dtype) -> [T, Hq, Dv]
AttentionFn = Callable[..., torch.Tensor]


class _Runner:
    def __init__(
        self,
        memory: KVCacheMemory,
        seed: int,
        atol: float,
        attention: AttentionFn,
    ) -> None:
        self.memory = memory
        self.attention = attention
        self.views = _attention_layers(memory)
        self.state_views = [v for v in memory.layers.values() if v.layout == "state"]
        self.content = _content(self.views, seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.atol = atol
        self.max_error = 0.0
        self.num_checks = 0

    def run_step(
        self,
        step: int,
        chunks: list[ScheduledChunk],
        metadata: dict[int, AttentionMetadata],
        block_ids: list[tuple[list[int], ...]],
    ) -> None:
        self._write_states(block_ids)
        for name, view in self.views.items():
            meta = metadata[view.group_id]
            self._write(name, view, chunks, meta)
        for name, view in self.views.items():
            self._attend(step, name, view, chunks, metadata[view.group_id])

    def _write_states(self, block_ids: list[tuple[list[int], ...]]) -> None:
        """Overwrite each request's current state block: if a state block were also an
        attention block, the attention check would see the damage."""
        for view in self.state_views:
            for ids in block_ids:
                current = [b for b in ids[view.group_id] if b]
                for tensor in view.tensors if current else ():
                    tensor[current[-1]] = torch.randn(
                        tensor.shape[1:], generator=self.gen, dtype=torch.float64
                    ).to(tensor.dtype)

    def _rows(
        self, chunk: ScheduledChunk, name: str, start: int, end: int
    ) -> tuple[torch.Tensor, ...]:
        request = chunk.request
        return self.content.layer_rows(request.request_id, request.all_token_ids, name, start, end)

    def _write(
        self, name: str, view: LayerView, chunks: list[ScheduledChunk], meta: AttentionMetadata
    ) -> None:
        parts = [
            self._rows(c, name, c.num_computed_tokens, c.num_computed_tokens + c.num_new_tokens)
            for c in chunks
        ]
        device = view.tensor.device
        key = torch.cat([p[0] for p in parts]).to(device)
        value = torch.cat([p[1] for p in parts]).to(device) if view.layout != "latent" else None
        write_kv(view, meta.slot_mapping, key, value)

    def _attend(
        self,
        step: int,
        name: str,
        view: LayerView,
        chunks: list[ScheduledChunk],
        meta: AttentionMetadata,
    ) -> None:
        latent = view.layout == "latent"
        head = int(view.tensor.shape[-1])
        heads = 2 if latent else 2 * _row_shape(view)[0]
        v_size = max(1, head // 2) if latent else None
        query = torch.randn(
            len(meta.positions), heads, head, generator=self.gen, dtype=torch.float64
        )
        got = self.attention(
            view,
            query.to(view.tensor.device),
            meta,
            value_head_size=v_size,
            compute_dtype=torch.float64,
        ).cpu()
        window = window_for_spec(view.spec)
        starts = meta.query_start_loc.tolist()
        for i, chunk in enumerate(chunks):
            end = chunk.num_computed_tokens + chunk.num_new_tokens
            rows = self._rows(chunk, name, 0, end)
            key, value = (rows[0][:, None], rows[0][:, None, :v_size]) if latent else rows
            q_pos = torch.arange(chunk.num_computed_tokens, end)
            expected = attend(
                query[starts[i] : starts[i + 1]], key, value, q_pos, torch.arange(end), window
            )
            error = float((got[starts[i] : starts[i + 1]] - expected).abs().max())
            self.num_checks += 1
            self.max_error = max(self.max_error, error)
            if not error <= self.atol:
                raise PagedAttentionMismatch(
                    f"step {step}, request {chunk.request.request_id!r}, layer {name!r} "
                    f"(group {view.group_id}, tokens {chunk.num_computed_tokens}..{end}): paged "
                    f"attention differs from dense attention by {error:.3g} > {self.atol:.3g}"
                )


def _poison(memory: KVCacheMemory) -> None:
    """Fill every float page with NaN so reading an unwritten slot cannot pass."""
    for view in memory.layers.values():
        for tensor in view.tensors:
            if tensor.dtype.is_floating_point:
                tensor.fill_(float("nan"))


def check_paged_attention(
    kv_cache_config: KVCacheConfig,
    config: EngineConfig,
    workload: list[WorkloadRequest],
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    atol: float = 1e-9,
    max_num_batched_tokens: int = 32,
    max_num_seqs: int = 8,
    max_steps: int = 2000,
    attention: AttentionFn = paged_attention,
) -> CheckReport:
    """Run ``workload`` through a real KVCacheManager and real tensors; raise
    PagedAttentionMismatch at the first query whose paged output differs from dense.

    ``attention`` is the paged attention under test (default: the reference); it is
    called like :func:`paged_attention` and may run on ``device``.

    Args:
        kv_cache_config: the planned KV cache config, allocated for real.
        config: the engine config the manager runs with.
        workload: the requests run.
        device: where the cache tensors and attention run.
        seed: seeds the generated K/V content and queries.
        atol: the largest absolute difference from dense attention accepted.
        max_num_batched_tokens: tokens scheduled per step.
        max_num_seqs: requests running at once.
        max_steps: steps after which an unfinished workload raises CheckStalledError.
        attention: the paged attention function under test.
    """
    manager = KVCacheManager(kv_cache_config, config)
    for item in workload:
        num_tokens = len(item.prompt_token_ids) + len(item.output_token_ids)
        if num_tokens > manager.max_model_len:
            raise ConfigError(
                f"workload request {item.request_id!r} has {num_tokens} tokens, more than "
                f"max_model_len={manager.max_model_len}"
            )
    memory = allocate_kv_cache(kv_cache_config, device)
    _poison(memory)
    runner = _Runner(memory, seed, atol, attention)
    scheduler = MiniScheduler(manager, workload, max_num_batched_tokens, max_num_seqs)
    groups = kv_cache_config.kv_cache_groups
    checked_groups = sorted({v.group_id for v in runner.views.values()})
    block_sizes = [groups[g].kv_cache_spec.block_size for g in checked_groups]
    num_tokens = num_nulls = step = 0
    while not scheduler.done:
        if step >= max_steps:
            raise CheckStalledError(f"workload did not finish in {max_steps} steps")
        chunks = scheduler.step()
        block_ids = [manager.get_block_ids(c.request.request_id) for c in chunks]
        scheduled = [
            ScheduledRequest(
                [ids[g] for g in checked_groups], c.num_computed_tokens, c.num_new_tokens
            )
            for ids, c in zip(block_ids, chunks)
        ]
        num_nulls += sum(row.count(0) for s in scheduled for row in s.block_ids)
        per_group = build_attention_metadata(scheduled, block_sizes, device)
        metadata = dict(zip(checked_groups, per_group, strict=True))
        if chunks:
            runner.run_step(step, chunks, metadata, block_ids)
        num_tokens += sum(c.num_new_tokens for c in chunks)
        scheduler.finish_step(chunks)
        step += 1
    return CheckReport(
        step,
        len(workload),
        num_tokens,
        scheduler.num_hit_tokens,
        scheduler.num_preemptions,
        num_nulls,
        runner.num_checks,
        tuple(runner.views),
        runner.max_error,
    )
