"""vLLM's start-up memory accounting, one term at a time.

At start-up each vLLM worker asks for ``ceil(total device memory x
gpu_memory_utilization)`` bytes and gives the KV cache what its profile leaves:

    requested - weights - non-torch memory - profile peak - CUDA graph estimate

The profile peak is the largest transient of one dummy pass: the forward pass at
``max_num_batched_tokens``, the sampler warm-up over ``max_num_seqs`` full-vocabulary
rows, or a multimodal encoder's dummy items. Since 0.21 vLLM also captures two CUDA
graphs per mode and charges the extrapolated pool (``VLLM_MEMORY_PROFILER_ESTIMATE_
CUDAGRAPHS``; none with ``--enforce-eager``). Each term here is an estimate from the
config and the flags; docs/memory.md gives the formulas, the constants' sources and
how close they come to public start-up logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.dtypes import dtype_size
from pagedkv.errors import ConfigError
from pagedkv.models.layers import ModelLayout
from pagedkv.models.profile_shape import EncoderShape, ProfileShape

GiB = 2**30
MiB = 2**20

# Memory the worker gains outside PyTorch's allocator between its start snapshot and
# the end of the profile (cuBLAS/attention workspaces; NCCL and custom all-reduce
# buffers once there are peers). llm-d-benchmark's H100 runs (vLLM 0.11) measured
# 0.13-0.14 GiB alone and 0.54-0.55 GiB at TP=2 (tests/data/vllm_startup_logs.jsonl).
NON_TORCH_BYTES = int(0.13 * GiB)
NON_TORCH_BYTES_WITH_PEERS = int(0.55 * GiB)

# Bytes the sampler warm-up holds per (request, vocabulary entry) on top of the
# model-dtype logits, by the sampler vLLM warms up:
#   triton     (0.33): a float32 copy, the softmax probabilities and the exponential
#                      noise (3 x 4 bytes; top-k/top-p run in place in Triton).
#   sort       (0.11): the float32 copy, a sorted copy with int64 indices, sort
#                      workspace, masks, probabilities and noise; the llm-d H100 rows
#                      measure 38.5-39.6 bytes in all (2 of them the bf16 logits).
#   flashinfer (0.10): one FlashInfer call on a float32 copy and its probabilities;
#                      without FlashInfer installed (or with VLLM_USE_FLASHINFER_SAMPLER=0)
#                      0.10 warms the PyTorch-native top-k/top-p up instead: the sort.
SAMPLER_BYTES_PER_LOGIT = {"triton": 12.0, "sort": 36.5, "flashinfer": 8.0}

# Each CUDA graph after the first of its mode: 0.37 GiB over 54 graphs and 0.64 GiB
# over 86 graphs in two public 0.2x logs with small first captures.
CUDAGRAPH_BYTES_PER_GRAPH = 8 * MiB
# Largest graph vLLM captures by default (1024 on Blackwell, which the GPU table's
# B200/B300/GB200 entries are).
CUDAGRAPH_MAX_TOKENS = 512


class MemoryTerm(NamedTuple):
    """One row of the memory table: what, bytes per worker, how it was sized.
    ``counted`` is False for a term that overlaps a larger one (only the profile
    peak is charged)."""

    name: str
    bytes: int
    how: str
    counted: bool = True


@dataclass(frozen=True)
class StartupOptions:
    """The ``vllm serve`` flags and vLLM release that change what start-up measures.
    ``flashinfer_sampler``: FlashInfer's top-k/top-p sampler is installed and enabled
    (read by ``for_vllm_version`` for releases before 0.11)."""

    enforce_eager: bool = False
    cudagraph_memory_estimate: bool = True
    sampler: str = "triton"
    cpu_offload_bytes: int = 0
    quantization: str | None = None
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    blackwell: bool = False
    flashinfer_sampler: bool = True

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLER_BYTES_PER_LOGIT:
            known = ", ".join(SAMPLER_BYTES_PER_LOGIT)
            raise ConfigError(
                f"StartupOptions.sampler must be one of {known}, got {self.sampler!r}"
            )
        if self.data_parallel_size < 1:
            raise ConfigError(
                f"data_parallel_size must be a positive integer, got {self.data_parallel_size!r}"
            )

    @classmethod
    def for_vllm_version(cls, version: str, flags: StartupOptions | None = None) -> StartupOptions:
        """``flags`` accounted as an older vLLM release did (for checking against its
        logs): the sampler it warms up, and CUDA graphs charged from 0.21 on. Before
        0.11 the warm-up is FlashInfer's when ``flags.flashinfer_sampler`` (FlashInfer
        installed and enabled), else the native sort that 0.11 to 0.16 always ran."""
        found = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
        if found is None:
            raise ConfigError(f"cannot read a vLLM version from {version!r} (example: 0.11.0)")
        release = (int(found.group(1)), int(found.group(2)))
        options = flags or cls()
        if release >= (0, 17):
            sampler = "triton"
        elif release >= (0, 11) or not options.flashinfer_sampler:
            sampler = "sort"
        else:
            sampler = "flashinfer"
        return replace(options, sampler=sampler, cudagraph_memory_estimate=release >= (0, 21))


def _activation_bytes(layout: ModelLayout) -> int:
    """Activations run in the model dtype, at least 2 bytes (fp8 checkpoints compute in bf16)."""
    return max(dtype_size(layout.dtype), 2)


def _moe_width(shape: ProfileShape, layout: ModelLayout, shard: int) -> int:
    """Per-token width of a fused-MoE layer: router logits, the gate/up and activation
    caches of each routed copy, its down-projection output, a shared expert."""
    if not (shape.num_experts and shape.experts_per_token):
        return 0
    routed = shape.experts_per_token * (
        3 * shape.moe_intermediate_size // shard + layout.hidden_size
    )
    shared = 3 * shape.shared_expert_intermediate_size // shard
    return routed + shared + 2 * shape.num_experts  # fp32 router logits, in 2-byte units


def forward_width(layout: ModelLayout, shape: ProfileShape, tp: int, expert_shard: int) -> int:
    """Elements per token alive at a decoder layer's peak: the hidden state and its
    residual, plus the wider of attention (q, k, v, output) and the MLP or MoE.

    Args:
        layout: the model's layout (hidden and intermediate sizes).
        shape: the profiling shape (attention widths, MoE sizes).
        tp: the tensor-parallel size.
        expert_shard: ranks the experts are split over.
    """
    attention = (2 * shape.q_width + shape.kv_width) // tp
    mlp = 3 * layout.intermediate_size // tp
    moe = _moe_width(shape, layout, expert_shard)
    return 2 * layout.hidden_size + max(attention, mlp, moe)


def forward_bytes(
    layout: ModelLayout, shape: ProfileShape, tokens: int, tp: int, expert_shard: int
) -> int:
    """Bytes of the activations alive at a decoder layer's peak for ``tokens`` tokens.

    Args:
        layout: the model's layout (hidden and intermediate sizes, activation dtype).
        shape: the profiling shape (attention widths, MoE sizes).
        tokens: tokens in the forward pass.
        tp: the tensor-parallel size.
        expert_shard: ranks the experts are split over.
    """
    return tokens * forward_width(layout, shape, tp, expert_shard) * _activation_bytes(layout)


def sampler_bytes(
    layout: ModelLayout, shape: ProfileShape, seqs: int, tp: int, sampler: str
) -> int:
    """Logits for ``seqs`` rows (this rank's shard, then the gathered model-dtype rows)
    and the sampler's float32 work on them.

    Args:
        layout: the model's layout (activation dtype).
        shape: the profiling shape (vocabulary size).
        seqs: sequences sampled at once (rows of logits).
        tp: the tensor-parallel size the logits are sharded over.
        sampler: the sampler's name, a key of ``SAMPLER_BYTES_PER_LOGIT``.
    """
    act = _activation_bytes(layout)
    per_logit = act + (act / tp if tp > 1 else 0) + SAMPLER_BYTES_PER_LOGIT[sampler]
    return int(seqs * shape.vocab_size * per_logit)


def encoder_items(encoder: EncoderShape, budget_tokens: int) -> int:
    return max(1, budget_tokens // max(encoder.tokens_per_item, 1))


def encoder_bytes(encoder: EncoderShape, layout: ModelLayout, budget_tokens: int, tp: int) -> int:
    """The dummy items' tower activations (hidden, attention and MLP of one layer).

    Args:
        encoder: the encoder tower's shape.
        layout: the model's layout (activation dtype).
        budget_tokens: encoder tokens the profiling run may use.
        tp: the tensor-parallel size.
    """
    tokens = encoder_items(encoder, budget_tokens) * encoder.tokens_per_item
    width = 6 * encoder.hidden_size + 2 * encoder.intermediate_size // tp
    return tokens * width * _activation_bytes(layout)


class CaptureSizes(NamedTuple):
    """The CUDA graphs vLLM captures by default."""

    num_piecewise_graphs: int
    num_full_graphs: int
    max_capture_tokens: int  # the largest captured batch


def capture_sizes(max_num_seqs: int, max_tokens: int, blackwell: bool) -> CaptureSizes:
    """The CUDA graphs vLLM captures by default."""
    ceiling = 2 * CUDAGRAPH_MAX_TOKENS if blackwell else CUDAGRAPH_MAX_TOKENS
    largest = max(1, min(2 * max_num_seqs, ceiling, max_tokens))

    def count(limit: int) -> int:
        sizes = [n for n in (1, 2, 4) if n <= limit]
        sizes += list(range(8, min(limit + 1, 256), 8)) + list(range(256, limit + 1, 16))
        return len(sizes)

    return CaptureSizes(count(largest), count(min(max_num_seqs, largest)), largest)


def profile_terms(
    layout: ModelLayout,
    shape: ProfileShape,
    config: EngineConfig,
    options: StartupOptions,
) -> list[MemoryTerm]:
    """Every non-weight term of one worker's start-up accounting.

    Args:
        layout: the model's layout.
        shape: the profiling shape.
        config: the engine config (parallel sizes, batch limits).
        options: the vLLM flags (data parallelism, sampler, CUDA graphs).
    """
    tp = config.parallel.tensor_parallel_size
    world = tp * config.parallel.pipeline_parallel_size * options.data_parallel_size
    tokens = config.scheduler.max_num_batched_tokens
    seqs = config.scheduler.max_num_seqs
    expert_shard = tp * options.data_parallel_size if options.enable_expert_parallel else tp
    act = _activation_bytes(layout)
    peers = world > 1
    terms = [
        MemoryTerm(
            "non-torch (CUDA, NCCL)",
            NON_TORCH_BYTES_WITH_PEERS if peers else NON_TORCH_BYTES,
            "workspaces + NCCL buffers" if peers else "cuBLAS/attention workspaces",
        )
    ]
    forward = forward_bytes(layout, shape, tokens, tp, expert_shard)
    kept = tokens * layout.hidden_size * act
    sampler = sampler_bytes(layout, shape, seqs, tp, options.sampler) + kept
    candidates = [
        MemoryTerm(
            "forward pass",
            forward,
            f"{tokens:,} tokens x {forward_width(layout, shape, tp, expert_shard):,} values",
        ),
        MemoryTerm(
            "sampler warm-up",
            sampler,
            f"{seqs:,} seqs x {shape.vocab_size:,} logits ({options.sampler})",
        ),
    ]
    for encoder in shape.encoders:
        budget = max(tokens, encoder.tokens_per_item)
        items = encoder_items(encoder, budget)
        candidates.append(
            MemoryTerm(
                f"{encoder.kind} encoder dummy inputs",
                encoder_bytes(encoder, layout, budget, tp),
                f"{items} item(s) x {encoder.tokens_per_item:,} patches",
            )
        )
    peak = max(candidates, key=lambda term: term.bytes)
    for term in candidates:
        terms.append(
            term._replace(
                counted=term is peak, how=term.how + ("" if term is peak else "; overlaps the peak")
            )
        )
    terms.append(cudagraph_term(layout, shape, config, options, expert_shard))
    return terms


def cudagraph_term(
    layout: ModelLayout,
    shape: ProfileShape,
    config: EngineConfig,
    options: StartupOptions,
    expert_shard: int,
) -> MemoryTerm:
    """The CUDA graph term: the largest capture's forward pass plus a cost per further graph.

    Args:
        layout: the model's layout.
        shape: the profiling shape.
        config: the engine config (batch limits, tensor-parallel size).
        options: the vLLM flags (eager mode, GPU generation, vLLM release).
        expert_shard: ranks the experts are split over.
    """
    if options.enforce_eager:
        return MemoryTerm("CUDA graph estimate", 0, "none: --enforce-eager")
    if not options.cudagraph_memory_estimate:
        return MemoryTerm("CUDA graph estimate", 0, "not charged before vLLM 0.21")
    tp = config.parallel.tensor_parallel_size
    piecewise, full, largest = capture_sizes(
        config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens, options.blackwell
    )
    first = forward_bytes(layout, shape, largest, tp, expert_shard)
    graphs = piecewise + full
    total = first + CUDAGRAPH_BYTES_PER_GRAPH * max(graphs - 2, 0)
    return MemoryTerm(
        "CUDA graph estimate",
        total,
        f"{piecewise} piecewise + {full} full graphs (largest {largest})",
    )


def reserve_bytes(terms: list[MemoryTerm]) -> int:
    """What the terms take from the KV cache: every counted term."""
    return sum(term.bytes for term in terms if term.counted)


__all__ = [
    "CUDAGRAPH_BYTES_PER_GRAPH",
    "NON_TORCH_BYTES",
    "NON_TORCH_BYTES_WITH_PEERS",
    "SAMPLER_BYTES_PER_LOGIT",
    "CaptureSizes",
    "MemoryTerm",
    "StartupOptions",
    "capture_sizes",
    "forward_bytes",
    "profile_terms",
    "reserve_bytes",
    "sampler_bytes",
]
