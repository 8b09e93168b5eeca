"""What a deployment plan is asked: the model, the GPUs, vLLM's flags and pagedkv's own
options, with the defaults ``vllm serve`` would use."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple, TypedDict

from pagedkv.errors import ConfigError
from pagedkv.models import GPU, ModelLayout
from pagedkv.models.source import ModelLike

__all__ = [
    "DEFAULT_GPU",
    "PlanRequest",
    "SchedulerDefaults",
    "VLLMFlagArgs",
    "VLLMFlags",
    "vllm_flags_from",
    "vllm_scheduler_defaults",
]

# The GPU a plan is for when neither a GPU, a memory size nor a KV cache budget is given.
DEFAULT_GPU = "H100-80GB"


@dataclass(frozen=True, kw_only=True)
class VLLMFlags:
    """``vllm serve`` flags that change the KV cache plan, under vLLM's names.

    None means vLLM's default: the model's ``max_model_len``, ``max_num_seqs`` and
    ``max_num_batched_tokens`` for the device (``vllm_scheduler_defaults``), prefix
    caching on (off for encoder-decoder models). ``max_model_len=-1`` fits the longest
    request the memory holds. ``prefix_caching_hash_algo`` is accepted and changes nothing.

    The start-up memory accounting reads ``enforce_eager`` (no CUDA graph estimate),
    ``dtype`` (vLLM's ``--dtype``: auto, half, float16, bfloat16, float, float32),
    ``quantization`` (fp8 quantises an unquantized checkpoint at load),
    ``data_parallel_size`` with ``enable_expert_parallel`` (experts split over tp x dp
    ranks), ``speculative_config`` (vLLM's JSON; ``mtp`` loads the MTP layers) and
    ``cpu_offload_gb``. ``kv_cache_layout`` is vLLM's ``VLLM_KV_CACHE_LAYOUT`` (None:
    the platform's); block-outermost layouts pack groups of different page sizes.
    ``flashinfer_sampler`` is False where FlashInfer is not installed or
    ``VLLM_USE_FLASHINFER_SAMPLER=0`` (the log warns "FlashInfer is not available"):
    vLLM releases before 0.11 then warm the native top-k/top-p sort up at start-up.
    """

    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    prefix_caching_hash_algo: str = "sha256"
    enforce_eager: bool = False
    dtype: str = "auto"
    quantization: str | None = None
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    speculative_config: str | None = None
    cpu_offload_gb: float = 0.0
    kv_cache_layout: str | None = None
    flashinfer_sampler: bool = True


class VLLMFlagArgs(TypedDict, total=False):
    """``VLLMFlags`` as keyword arguments of ``pagedkv.plan``."""

    max_model_len: int | None
    block_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enable_prefix_caching: bool | None
    prefix_caching_hash_algo: str
    enforce_eager: bool
    dtype: str
    quantization: str | None
    data_parallel_size: int
    enable_expert_parallel: bool
    speculative_config: str | None
    cpu_offload_gb: float
    kv_cache_layout: str | None
    flashinfer_sampler: bool


def vllm_flags_from(flags: VLLMFlagArgs) -> VLLMFlags:
    """``VLLMFlags`` from keyword arguments; an unknown name is a ConfigError naming it."""
    known = {f.name for f in fields(VLLMFlags)}
    unknown = sorted(set(flags) - known)
    if unknown:
        raise ConfigError(
            f"unknown vLLM flag {unknown[0]!r} for pagedkv.plan; the flags that change a "
            f"plan: {', '.join(sorted(known))}"
        )
    return VLLMFlags(**flags)


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """Everything one plan is made from.

    Args:
        model: bundled name, directory, config.json, Hub id, ModelSource or ModelLayout.
        gpu: a GPU from the table (``pagedkv gpus``) or ``local[:N]``; the default
            ``DEFAULT_GPU`` unless ``memory_bytes`` or ``flags.kv_cache_memory_bytes``
            gives the budget instead.
        memory_bytes: device memory per worker, instead of a GPU.
        tensor_parallel_size, pipeline_parallel_size: workers = their product.
        flags: vLLM's flags (``VLLMFlags``).
        weight_bytes: weights per worker (None: estimated from the config).
        grouping: ``"vllm"`` (vLLM 0.33's rule) or ``"least-waste"`` (pagedkv's search).
        max_kv_cache_groups: most groups ``least-waste`` may choose (None: its default).
        context_lengths: extra context lengths for the concurrency table.
        revision: Hub revision of the model's config.
        vllm_version: account start-up memory as this vLLM release did (None: 0.33).
    """

    model: ModelLike | ModelLayout
    gpu: str | GPU | None = None
    memory_bytes: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    flags: VLLMFlags = field(default_factory=VLLMFlags)
    weight_bytes: int | None = None
    grouping: str = "vllm"
    max_kv_cache_groups: int | None = None
    context_lengths: tuple[int, ...] = ()
    revision: str | None = None
    vllm_version: str | None = None


class SchedulerDefaults(NamedTuple):
    """``vllm serve``'s scheduler limits for a device."""

    max_num_seqs: int  # requests per step
    max_num_batched_tokens: int  # tokens per step


def vllm_scheduler_defaults(device_bytes: int | None, device_name: str) -> SchedulerDefaults:
    """``vllm serve``'s (max_num_seqs, max_num_batched_tokens) for a device.

    vLLM 0.33 reads the total memory CUDA reports: 160 GiB and more (B200, B300)
    get 16,384 tokens a step; 70 GiB and more 8,192, except A100s (slower there) and
    the GB10 (DGX Spark: the memory without the compute); the rest, and an unknown
    device (memory not given), get 2,048 tokens and 256 requests.
    """
    total = device_bytes or 0
    name = device_name.lower()
    if total >= 160 * 2**30:
        return SchedulerDefaults(1024, 16384)
    if total >= 70 * 2**30 and "a100" not in name and "gb10" not in name:
        return SchedulerDefaults(1024, 8192)
    return SchedulerDefaults(256, 2048)
