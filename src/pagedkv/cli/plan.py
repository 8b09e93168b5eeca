"""``pagedkv plan``: how a model's KV cache is laid out on given GPUs, and what fits.

The command reads the model, sizes each worker's memory budget and asks the planner
once; ``plan_render`` prints the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from pagedkv import deployment
from pagedkv.cli import vllm_flags as vf
from pagedkv.cli.common import (
    BLOCK_SIZE_OPTION,
    DEFAULT_GPU,
    JSON_OPTION,
    KV_CACHE_DTYPE_OPTION,
    MAX_MODEL_LEN_OPTION,
    PLATFORM_OPTION,
    PP_OPTION,
    PREFIX_CACHING_OPTION,
    REVISION_OPTION,
    TP_OPTION,
    check_hash_algo,
    check_output_dir,
    parse_bytes,
    parse_max_model_len,
    stderr_console,
)
from pagedkv.cli.plan_render import PlanResult
from pagedkv.deployment import VLLMFlags
from pagedkv.deployment.plan_model import ALLOW_LONG_ENV
from pagedkv.errors import ConfigError, PlanningError
from pagedkv.models import ModelLayout, ModelSource

# A 5:1 sliding-window hybrid on the most common serving GPU: its plan shows hybrid
# grouping (vLLM's rule pads 8 layer slots here; --grouping least-waste shows what the
# search weighed) and how concurrency collapses from 1K to 128K contexts, on one screen.
DEFAULT_MODEL = "gemma-3-27b-it"


@dataclass(frozen=True)
class PlanOptions:
    """The command line as given (sizes as text); ``to_library`` reads it into the
    library's ``pagedkv.deployment.PlanRequest``."""

    model: str | ModelSource
    gpu: str | None = None
    memory: str | None = None
    gpu_memory_utilization: float = 0.9
    weights: str = "auto"
    kv_cache_memory: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    context_lengths: tuple[int, ...] = ()
    max_groups: int | None = None
    grouping: str = "vllm"
    # None: vLLM's `vllm serve` default for the device.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    num_gpu_blocks_override: int | None = None
    prefix_caching_hash_algo: str = "sha256"
    revision: str | None = None
    # vLLM flags that change the start-up memory accounting (cli.vllm_flags).
    enforce_eager: bool = False
    dtype: str = "auto"
    quantization: str | None = None
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    speculative_config: str | None = None
    cpu_offload_gb: float = 0.0
    # Account memory as this vLLM release does (None: 0.33).
    vllm_version: str | None = None
    # None: the platform's layout (layer-outermost NHD on the generic platform).
    kv_cache_layout: str | None = None
    # False: FlashInfer's sampler not installed or disabled (VLLM_USE_FLASHINFER_SAMPLER=0).
    flashinfer_sampler: bool = True

    def to_library(self) -> deployment.PlanRequest:
        kv_memory = self.kv_cache_memory
        flags = VLLMFlags(
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            kv_cache_dtype=self.kv_cache_dtype,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_bytes=(
                parse_bytes(kv_memory, "--kv-cache-memory-bytes") if kv_memory else None
            ),
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            enforce_eager=self.enforce_eager,
            dtype=self.dtype,
            quantization=self.quantization,
            data_parallel_size=self.data_parallel_size,
            enable_expert_parallel=self.enable_expert_parallel,
            speculative_config=self.speculative_config,
            cpu_offload_gb=self.cpu_offload_gb,
            kv_cache_layout=self.kv_cache_layout,
            flashinfer_sampler=self.flashinfer_sampler,
        )
        if self.gpu and self.memory:
            raise ConfigError("--gpu and --memory are alternatives; give one")
        return deployment.PlanRequest(
            model=self.model,
            gpu=self.gpu,
            memory_bytes=parse_bytes(self.memory, "--memory") if self.memory else None,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            flags=flags,
            weight_bytes=None if self.weights == "auto" else parse_bytes(self.weights, "--weights"),
            grouping=self.grouping,
            max_kv_cache_groups=self.max_groups,
            context_lengths=self.context_lengths,
            revision=self.revision,
            vllm_version=self.vllm_version,
        )


CONTEXT_LEN_OPTION = typer.Option(
    [], "--context-len", help="Extra context length for the concurrency table (repeatable)."
)
MAX_GROUPS_OPTION = typer.Option(
    None,
    "--max-groups",
    min=1,
    help="Most KV cache groups --grouping least-waste may choose (default 16); "
    "fewer groups cost less run time per call, more may waste less memory.",
)
GROUPING_OPTION = typer.Option(
    "vllm",
    "--grouping",
    help="How layers form KV cache groups: vllm (vLLM 0.33's rule) or least-waste "
    "(pagedkv's search for the fewest bytes per request).",
)
KV_CACHE_LAYOUT_OPTION = typer.Option(
    None,
    "--kv-cache-layout",
    help="Physical KV cache layout, as vLLM's VLLM_KV_CACHE_LAYOUT (LBNHC, BLNHC, ...); "
    "block-outermost ones (B first) pack groups of different page sizes.",
)
PLOT_OPTION = typer.Option(
    None, "--plot", help="Write max concurrency vs context length (PNG, needs matplotlib)."
)


def plan_command(
    model: str = typer.Argument(
        DEFAULT_MODEL, help="Hugging Face model id, bundled model name, directory or config.json."
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"GPU from `pagedkv gpus`, or local[:N] (default {DEFAULT_GPU})."
    ),
    memory: str | None = typer.Option(None, "--memory", help="Device memory, e.g. 80GiB."),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", help="Share of device memory the engine may use."
    ),
    weights: str = typer.Option("auto", "--weights", help="Weight bytes per worker, or auto."),
    kv_cache_memory: str | None = typer.Option(
        None,
        "--kv-cache-memory-bytes",
        "--kv-cache-memory",
        help="KV cache bytes per worker, e.g. 40GiB or 40G (skips the estimate).",
    ),
    num_gpu_blocks_override: int | None = typer.Option(
        None, "--num-gpu-blocks-override", min=1, help="Blocks per worker (as vLLM's)."
    ),
    tp: int = TP_OPTION,
    pp: int = PP_OPTION,
    max_model_len: str | None = MAX_MODEL_LEN_OPTION,
    block_size: int = BLOCK_SIZE_OPTION,
    kv_cache_dtype: str = KV_CACHE_DTYPE_OPTION,
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", min=1, help="Requests per step (default: vLLM's for the GPU)."
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        min=1,
        help="Tokens per step (default: vLLM's for the GPU); sizes the activation reserve.",
    ),
    enable_prefix_caching: bool | None = PREFIX_CACHING_OPTION,
    prefix_caching_hash_algo: str = typer.Option(
        "sha256",
        "--prefix-caching-hash-algo",
        callback=check_hash_algo,
        help="Accepted for vLLM command lines; it does not change a plan.",
    ),
    revision: str | None = REVISION_OPTION,
    enforce_eager: bool = vf.ENFORCE_EAGER_OPTION,
    dtype: str = vf.DTYPE_OPTION,
    quantization: str | None = vf.QUANTIZATION_OPTION,
    data_parallel_size: int = vf.DATA_PARALLEL_OPTION,
    enable_expert_parallel: bool = vf.EXPERT_PARALLEL_OPTION,
    speculative_config: str | None = vf.SPECULATIVE_OPTION,
    cpu_offload_gb: float = vf.CPU_OFFLOAD_OPTION,
    vllm_version: str | None = vf.VLLM_VERSION_OPTION,
    flashinfer_sampler: bool = vf.FLASHINFER_SAMPLER_OPTION,
    trust_remote_code: bool = vf.TRUST_REMOTE_CODE_OPTION,
    host: str | None = vf.HOST_OPTION,
    port: int | None = vf.PORT_OPTION,
    served_model_name: list[str] = vf.SERVED_NAME_OPTION,
    platform: str | None = PLATFORM_OPTION,
    context_len: list[int] = CONTEXT_LEN_OPTION,
    max_groups: int | None = MAX_GROUPS_OPTION,
    grouping: str = GROUPING_OPTION,
    kv_cache_layout: str | None = KV_CACHE_LAYOUT_OPTION,
    json_output: bool = JSON_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """Plan the KV cache of MODEL on a GPU: groups, blocks, capacity, waste."""
    from pagedkv.cli.plan_render import print_json, print_tables, write_plot
    from pagedkv.cli.progress import require_matplotlib

    if plot is not None:
        require_matplotlib()
        check_output_dir("--plot", plot)
    request = PlanOptions(
        model=model,
        gpu=gpu,
        memory=memory,
        gpu_memory_utilization=gpu_memory_utilization,
        weights=weights,
        kv_cache_memory=kv_cache_memory,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=parse_max_model_len(max_model_len),
        block_size=block_size,
        kv_cache_dtype=kv_cache_dtype,
        context_lengths=tuple(context_len),
        max_groups=max_groups,
        grouping=grouping,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        num_gpu_blocks_override=num_gpu_blocks_override,
        prefix_caching_hash_algo=prefix_caching_hash_algo,
        revision=revision,
        enforce_eager=enforce_eager,
        dtype=dtype,
        quantization=quantization,
        data_parallel_size=data_parallel_size,
        enable_expert_parallel=enable_expert_parallel,
        speculative_config=speculative_config,
        cpu_offload_gb=cpu_offload_gb,
        vllm_version=vllm_version,
        flashinfer_sampler=flashinfer_sampler,
        kv_cache_layout=kv_cache_layout,
    )
    result = make_plan(request)
    if plot is not None:
        write_plot(result, plot)
    if json_output:
        print_json(result)
    else:
        print_tables(result, plot)


def check_model_limit(layout: ModelLayout, max_model_len: int | None) -> None:
    """The library's check, with the warning the CLI prints when it is overridden."""
    if deployment.check_model_limit(layout, max_model_len):
        warn_above_limit(layout, max_model_len)


def warn_above_limit(layout: ModelLayout, max_model_len: int | None) -> None:
    stderr_console().print(
        f"warning: --max-model-len {max_model_len:,} is above {layout.name}'s limit "
        f"{layout.max_model_len:,}; planning it because {ALLOW_LONG_ENV} is set",
        markup=False,
    )


def make_plan(request: PlanOptions) -> PlanResult:
    """The library's plan for the command line (``pagedkv.plan`` with the same inputs)."""
    result = deployment.plan_model(request.to_library())
    if result.above_model_limit:
        warn_above_limit(result.layout, request.max_model_len)
    return result


__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "PlanOptions",
    "PlanResult",
    "PlanningError",
    "make_plan",
]
