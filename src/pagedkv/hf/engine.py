"""A small continuous-batching engine: a transformers causal LM over pagedkv's plan,
block tables and tensors.

Each step the scheduler (chunked prefill, prefix hits, recompute preemption) picks
request chunks; their tokens run through the model as one packed sequence, every
attention layer writing and reading its K/V through pagedkv's views
(:mod:`pagedkv.hf.attention`), and each request that reached its last token samples
its next one greedily.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pagedkv.capacity import KVCachePlan, plan_kv_cache
from pagedkv.errors import ConfigError
from pagedkv.hf.attention import (
    ATTENTION_NAME,
    HFIntegrationError,
    PagedStep,
    register_attention,
    running_step,
    views_by_layer,
)
from pagedkv.hf.cache import PagedCache
from pagedkv.hf.figures import CacheFigures, FigureCounter
from pagedkv.hf.mamba1 import mamba1_initial_states
from pagedkv.hf.rope import RopeRule, fixed_rope, rope_rule
from pagedkv.hf.sampling import GreedySampler
from pagedkv.hf.scheduler import GenerationScheduler, reaches_end
from pagedkv.hf.specs import dtype_name, kv_cache_specs_for, model_layout
from pagedkv.hf.state import StateIO, state_blocks, state_pieces
from pagedkv.models import engine_config_for
from pagedkv.runtime import KVCacheManager
from pagedkv.specs import MambaSpec
from pagedkv.tensors import (
    AttentionMetadata,
    KVCacheMemory,
    ScheduledRequest,
    allocate_kv_cache,
    build_attention_metadata,
)
from pagedkv.tensors.workload import ScheduledChunk, WorkloadRequest

__all__ = [
    "DEFAULT_KV_CACHE_BYTES",
    "GenerationOutput",
    "eos_token_ids",
    "paged_attention_implementation",
    "PagedGenerator",
]

DEFAULT_KV_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class GenerationOutput:
    """Generated token ids per prompt (prompt order) and the cache figures of the run."""

    token_ids: tuple[tuple[int, ...], ...]
    figures: CacheFigures


def eos_token_ids(model: Any) -> frozenset[int]:
    value = getattr(model.generation_config, "eos_token_id", None)
    if value is None:
        return frozenset()
    return frozenset([value] if isinstance(value, int) else value)


@contextlib.contextmanager
def paged_attention_implementation(model: Any) -> Iterator[None]:
    """Run ``model``'s attention through pagedkv, then give it back the implementation it
    had, so the user's own ``model.generate()`` afterwards works as before."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


class PagedGenerator:
    """Plan, allocate and run ``model`` on a pagedkv cache.

    ``num_blocks`` or ``kv_cache_memory_bytes`` (default 64 MiB) sizes the cache; ``block_size``,
    ``max_num_batched_tokens``, ``max_num_seqs`` and ``enable_prefix_caching`` are the
    engine settings of the same names.

    Args:
        model: a transformers causal LM (decoder-only).
        num_blocks: KV cache blocks to plan (None: sized by ``kv_cache_memory_bytes``).
        kv_cache_memory_bytes: bytes of KV cache (None with no ``num_blocks``: 64 MiB).
        block_size: tokens per block.
        max_model_len: the longest sequence in tokens (-1: fitted to the cache).
        max_num_batched_tokens: tokens scheduled per step.
        max_num_seqs: requests running at once.
        enable_prefix_caching: reuse cached blocks of shared prefixes.
    """

    def __init__(
        self,
        model: Any,
        *,
        num_blocks: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        block_size: int = 16,
        max_model_len: int = -1,
        max_num_batched_tokens: int = 64,
        max_num_seqs: int = 8,
        enable_prefix_caching: bool = True,
    ) -> None:
        register_attention()
        if num_blocks is None and kv_cache_memory_bytes is None:
            kv_cache_memory_bytes = DEFAULT_KV_CACHE_BYTES
        self.model = model
        dtype = dtype_name(model)  # what the model computes in (the adapter reads vLLM's)
        layout = model_layout(model)
        if layout.max_encoder_len:
            # Before planning: the model's encoder length would size cross-attention blocks
            # and a small cache would fail with a misleading out-of-memory error instead.
            raise HFIntegrationError(
                f"{layout.name}: pagedkv.hf runs decoder-only models; this one has "
                "cross-attention (encoder-decoder) layers, which it does not map"
            )
        self.config = engine_config_for(
            layout,
            dtype=dtype,
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            num_gpu_blocks_override=num_blocks,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            cache_dtype=dtype,
        )
        self.model_max_len = layout.max_model_len
        if self.model_max_len and max_model_len > self.model_max_len:
            raise ConfigError(
                f"max_model_len={max_model_len} is longer than {layout.name}'s "
                f"{self.model_max_len} positions (max_position_embeddings)"
            )
        self.specs = kv_cache_specs_for(model, self.config)
        budget = kv_cache_memory_bytes or (1 << 40)
        self.plan: KVCachePlan = plan_kv_cache(self.config, [self.specs], [budget])
        self.kv_cache_config = self.plan.configs[0]
        self.memory: KVCacheMemory = allocate_kv_cache(self.kv_cache_config, "cpu")
        self.layers = views_by_layer(self.memory.layers)
        groups = self.kv_cache_config.kv_cache_groups
        self.attention_groups = [
            gid for gid, g in enumerate(groups) if not isinstance(g.kv_cache_spec, MambaSpec)
        ]
        self.block_sizes = [groups[g].kv_cache_spec.block_size for g in self.attention_groups]
        self.has_latent = any(v.layout == "latent" for v in self.memory.layers.values())
        self.state_views = {i: v for i, v in self.layers.items() if v.layout == "state"}
        self.attention_layers = [i for i, v in self.layers.items() if v.layout != "state"]
        self.state_groups = sorted({v.group_id for v in self.state_views.values()})
        self.state_sizes = {g: groups[g].kv_cache_spec.block_size for g in self.state_groups}
        # align mode: block boundaries are checkpoints, so passes are cut there
        aligned = [
            size
            for g, size in self.state_sizes.items()
            if getattr(groups[g].kv_cache_spec, "mamba_cache_mode", "none") == "align"
        ]
        self.checkpoint_tokens = min(aligned) if aligned else None
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.sampler = GreedySampler.for_model(model, sorted(eos_token_ids(model)))

    def new_manager(self) -> KVCacheManager:
        return KVCacheManager(self.kv_cache_config, self.config)

    def max_sequence_len(self, manager: KVCacheManager) -> int:
        """The longest prompt plus output: the plan's length, at most the model's positions
        (a cache sized to fit more tokens than the model has positions does not lift that)."""
        if self.model_max_len:
            return min(manager.max_model_len, self.model_max_len)
        return manager.max_model_len

    def rope_rule(self) -> RopeRule | None:
        """How a batch-dependent RoPE (long-RoPE, dynamic NTK) is fixed in this engine's
        runs (vLLM's rule for its max_model_len); None for any other RoPE."""
        return rope_rule(self.model, self.max_sequence_len(self.new_manager()))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        arrivals_per_step: int = 1,
        max_steps: int = 100_000,
    ) -> GenerationOutput:
        """Greedy generation for every prompt; prompt ``i`` arrives at step
        ``i // arrivals_per_step``.

        Args:
            prompts: the prompts' token ids.
            max_new_tokens: tokens generated per prompt (fewer where an EOS token comes first).
            arrivals_per_step: prompts arriving at each step.
            max_steps: steps after which an unfinished generation raises HFIntegrationError.
        """
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        manager = self.new_manager()
        limit = self.max_sequence_len(manager)
        for i, prompt in enumerate(prompts):
            if not prompt or len(prompt) + max_new_tokens > limit:
                raise ConfigError(
                    f"prompt {i}: {len(prompt)} tokens + max_new_tokens={max_new_tokens} must "
                    f"be between 1 and {limit} tokens (the plan's max_model_len "
                    f"{manager.max_model_len}, the model's {self.model_max_len} positions)"
                )
        workload = [
            WorkloadRequest(f"prompt-{i}", tuple(p), (0,) * max_new_tokens)
            for i, p in enumerate(prompts)
        ]
        scheduler = GenerationScheduler(
            manager,
            workload,
            self.max_num_batched_tokens,
            self.max_num_seqs,
            arrivals_per_step,
            eos_token_ids=eos_token_ids(self.model),
        )
        counter = FigureCounter(manager, self.kv_cache_config, prompts)
        with (
            paged_attention_implementation(self.model),
            mamba1_initial_states(self.model),
            fixed_rope(self.model, rope_rule(self.model, limit)),
        ):
            for _ in range(max_steps):
                if scheduler.done:
                    break
                chunks = scheduler.step()
                sampled = self.run_step(chunks, manager, counter)
                scheduler.finish_with_tokens(chunks, sampled)
            else:
                raise HFIntegrationError(f"generation did not finish in {max_steps} steps")
        outputs = tuple(tuple(scheduler.generated[w.request_id]) for w in workload)
        return GenerationOutput(outputs, counter.figures(scheduler))

    def metadata(
        self, chunks: Sequence[ScheduledChunk], manager: KVCacheManager
    ) -> dict[int, AttentionMetadata]:
        block_ids = [manager.get_block_ids(c.request.request_id) for c in chunks]
        scheduled = [
            ScheduledRequest(
                [ids[g] for g in self.attention_groups], c.num_computed_tokens, c.num_new_tokens
            )
            for ids, c in zip(block_ids, chunks)
        ]
        per_group = build_attention_metadata(scheduled, self.block_sizes)
        return dict(zip(self.attention_groups, per_group, strict=True))

    @torch.no_grad()
    def run_step(
        self, chunks: list[ScheduledChunk], manager: KVCacheManager, counter: FigureCounter
    ) -> dict[str, int]:
        """Run the step's chunks; the greedy token of each request that reached its end.

        Attention-only models run every chunk in one packed pass; models with Mamba
        layers run one pass per request, split where a state checkpoint falls.
        """
        counter.record_step(chunks)
        if not chunks:
            return {}
        if not self.state_views:
            cache = PagedCache() if self.has_latent else None
            ending = [c for c in chunks if reaches_end(c)]
            return self.sample(ending, self.forward(chunks, manager, cache))
        sampled = {}
        for chunk in chunks:
            ids = manager.get_block_ids(chunk.request.request_id)
            tables = [ids[g] for g in self.state_groups]
            for piece in state_pieces(chunk, self.checkpoint_tokens, tables):
                states = StateIO(self.state_views, state_blocks(piece, ids, self.state_sizes))
                logits = self.forward([piece], manager, PagedCache(states), every_row=True)
                states.save()
            if reaches_end(chunk):
                sampled.update(self.sample([chunk], logits))
        return sampled

    def sample(self, ending: list[ScheduledChunk], logits: torch.Tensor) -> dict[str, int]:
        """The next token of each request whose chunk reached its end (one logits row each)."""
        tokens = self.sampler.choose(
            logits,
            [c.request.all_token_ids for c in ending],
            [c.request.num_prompt_tokens for c in ending],
        )
        return {c.request.request_id: t for c, t in zip(ending, tokens, strict=True)}

    def forward(
        self,
        chunks: list[ScheduledChunk],
        manager: KVCacheManager,
        cache: PagedCache | None,
        every_row: bool = False,
    ) -> torch.Tensor:
        """One forward pass over the packed chunks: the logits after the last token of each
        chunk that reaches its request's end (of every chunk with ``every_row``).

        Args:
            chunks: the step's scheduled chunks, packed in order.
            manager: the KV cache manager holding the chunks' blocks.
            cache: the cache passed to the model (None: the model runs without one).
            every_row: keep the logits after every chunk, not only those that reach their request's
                end.
        """
        metadata = self.metadata(chunks, manager)
        tokens = [
            t
            for c in chunks
            for t in c.request.all_token_ids[
                c.num_computed_tokens : c.num_computed_tokens + c.num_new_tokens
            ]
        ]
        positions = torch.cat(
            [
                torch.arange(c.num_computed_tokens, c.num_computed_tokens + c.num_new_tokens)
                for c in chunks
            ]
        )
        ends = torch.tensor([c.num_new_tokens for c in chunks]).cumsum(0) - 1
        keep = [i for i, c in enumerate(chunks) if every_row or reaches_end(c)]
        step = PagedStep(self.layers, metadata, {}, set())
        with running_step(step):
            logits = self.model(
                input_ids=torch.tensor([tokens]),
                position_ids=positions[None],
                cache=cache,
                use_cache=cache is not None,
                logits_to_keep=ends[keep],
            ).logits[0]
        self.check_attended(step)
        return logits

    def check_attended(self, step: PagedStep) -> None:
        """Every attention layer of the plan must have read its context from pagedkv's
        cache: a model whose attention bypasses transformers' ``AttentionInterface``
        would otherwise compute tokens from its own cache, silently."""
        missing = sorted(set(self.attention_layers) - step.attended)
        if missing:
            raise HFIntegrationError(
                f"{type(self.model).__name__}: decoder layers {missing} did not call "
                f"attn_implementation={ATTENTION_NAME!r} (their attention does not go "
                "through transformers' AttentionInterface), so pagedkv cannot run them"
            )
