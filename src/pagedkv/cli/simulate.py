"""``pagedkv simulate``: replay a request trace through the KV cache manager."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

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
    check_retention,
    parse_max_model_len,
    stderr_console,
)
from pagedkv.cli.progress import phase, progress_enabled, require_matplotlib
from pagedkv.cli.simulate_fleet import (
    RAY_OPTION,
    REPLICAS_OPTION,
    ROUTER_OPTION,
    WORKERS_OPTION,
    run_fleet,
)
from pagedkv.cli.simulate_render import notes, print_summary, print_sweep
from pagedkv.cli.simulate_tiers import (
    TierOptions,
    parse_tier_options,
    run_tier_sweep,
    single_setup,
    tier_rows,
)
from pagedkv.errors import ConfigError

if TYPE_CHECKING:
    from pagedkv.sim.replay_inputs import Replay
    from pagedkv.sim.scheduling.scheduler import SchedulerSettings

__all__ = [
    "DEFAULT_MODEL",
    "TRACE_FORMATS_HELP",
    "FleetOptions",
    "OutputOptions",
    "simulate_command",
]

# One full-attention group keeps the default run short (gemma-3-27b-it, 7 groups with
# vLLM's grouping, costs ~5x more per manager call); pass a model name for others.
DEFAULT_MODEL = "Llama-3.1-8B"
TRACE_FORMATS_HELP = (
    "Trace file, bundled name (mooncake_conversation, azure_conv, azure_code) or "
    "synthetic[:N[:SEED]]. Files read (.gz ok): .jsonl/.json with one request per line, "
    "either a Mooncake record (timestamp ms, input_length, output_length, hash_ids of "
    "--trace-block-size tokens each), or a record with its prompt: token_ids, a text "
    "prompt, or chat messages (text is tokenized by the model's tokenizer; needs "
    "transformers), with output_length or max_tokens and an optional timestamp (ms) and "
    "priority; .csv in Azure's LLM inference format (TIMESTAMP,ContextTokens,"
    "GeneratedTokens). Convert any other trace to one JSONL line per request with "
    "token_ids (or prompt/messages) and output_length."
)


@dataclass(frozen=True)
class FleetOptions:
    """``--replicas``, ``--router`` and where ``--sweep`` points run (``--workers``, ``--ray``)."""

    replicas: int = 1
    router: str = "round-robin"
    workers: int | None = None
    ray_address: str | None = None

    @property
    def active(self) -> bool:
        """A fleet run rather than one engine."""
        return self.replicas > 1 or self.router != "round-robin"


@dataclass(frozen=True)
class OutputOptions:
    """What the run prints and writes besides the summary."""

    json_output: bool = False
    bound: bool = False
    sweep: bool = False
    plot: str | None = None
    steps_csv: str | None = None


def _check_outputs(outputs: OutputOptions, fleet: FleetOptions) -> None:
    """Everything that would fail after the replay, checked before it starts."""
    if (fleet.workers is not None or fleet.ray_address is not None) and not outputs.sweep:
        raise ConfigError("--workers and --ray run --sweep points; add --sweep")
    if outputs.plot is not None and not outputs.sweep:
        raise ConfigError("--plot draws the --sweep; add --sweep")
    if outputs.steps_csv is not None and fleet.active:
        raise ConfigError("--steps-csv records one engine; it does not go with --replicas")
    if outputs.plot is not None:
        require_matplotlib()
    for option, value in (("--steps-csv", outputs.steps_csv), ("--plot", outputs.plot)):
        if value is not None:
            check_output_dir(option, value)


def simulate_command(
    model: str = typer.Argument(
        DEFAULT_MODEL, help="Hugging Face model id, bundled model name, directory or config."
    ),
    trace: str = typer.Option("mooncake_conversation", "--trace", help=TRACE_FORMATS_HELP),
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"Size the cache as `pagedkv plan` does for this GPU [{DEFAULT_GPU}]."
    ),
    num_blocks: int | None = typer.Option(
        None, "--num-blocks", "--num-gpu-blocks-override", min=2, help="KV cache blocks."
    ),
    max_num_seqs: int | None = typer.Option(
        None,
        "--max-num-seqs",
        min=1,
        help="Running requests cap [vllm serve's for the GPU: 1024 from 70 GiB (not "
        "A100 or GB10), else 256; --num-blocks runs use the default GPU's]. The planned "
        "cache uses it when given, else vLLM's default for the GPU, as `pagedkv plan` does.",
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        min=1,
        help="Token budget per step [vllm serve's for the GPU: 16384 from 160 GiB, 8192 "
        "from 70 GiB (not A100 or GB10), else 2048]; the planned cache uses it as "
        "`pagedkv plan` does.",
    ),
    long_prefill_token_threshold: int = typer.Option(
        0,
        "--long-prefill-token-threshold",
        min=0,
        help="vLLM's cap on one request's prefill tokens per step while others wait (0: off).",
    ),
    max_prefill_chunk: int | None = typer.Option(
        None,
        "--max-prefill-chunk",
        min=1,
        help="pagedkv's own cap on one request's tokens per step, always applied [none].",
    ),
    scheduling_policy: str = typer.Option(
        "fcfs", "--scheduling-policy", help="fcfs or priority (the trace's priority field)."
    ),
    arrivals: str = typer.Option(
        "timestamp",
        "--arrivals",
        help="timestamp (requests arrive at their trace times) or all (every request "
        "waits at t=0).",
    ),
    limit: int | None = typer.Option(
        None,
        "--limit",
        min=0,
        help="Replay only the first N requests [0 or none: the whole trace].",
    ),
    trace_block_size: int | None = typer.Option(
        None,
        "--trace-block-size",
        min=1,
        help="Tokens each hash id of a Mooncake trace covers [512, Mooncake's]; a trace "
        "whose ids do not fit it is refused.",
    ),
    tp: int = TP_OPTION,
    pp: int = PP_OPTION,
    block_size: int = BLOCK_SIZE_OPTION,
    max_model_len: str | None = MAX_MODEL_LEN_OPTION,
    kv_cache_dtype: str = KV_CACHE_DTYPE_OPTION,
    enable_prefix_caching: bool | None = PREFIX_CACHING_OPTION,
    hash_algo: str = typer.Option(
        "builtin",
        "--prefix-caching-hash-algo",
        "--hash-algo",
        callback=check_hash_algo,
        help="builtin (fast), or one of vLLM's: sha256, sha256_cbor, xxhash, xxhash_cbor.",
    ),
    revision: str | None = REVISION_OPTION,
    platform: str | None = PLATFORM_OPTION,
    retention: str = typer.Option(
        "vllm",
        "--retention",
        help="vllm (vLLM 0.33: window/Mamba blocks cached only where a hit needs them), "
        "dense (every full block cached, out-of-window blocks evicted first) or one a "
        "plugin adds to config.PREFIX_CACHE_RETENTIONS.",
    ),
    json_output: bool = JSON_OPTION,
    bound: bool = typer.Option(False, "--bound", help="Also the clairvoyant (Belady) bound."),
    sweep: bool = typer.Option(
        False, "--sweep", help="LRU and bound hit rate at 1/8x .. 4x the cache size."
    ),
    plot: str | None = typer.Option(None, "--plot", help="With --sweep: write a PNG."),
    steps_csv: str | None = typer.Option(None, "--steps-csv", help="Per-step time series."),
    skip_bad_lines: bool = typer.Option(
        False, "--skip-bad-lines", help="Skip and count malformed trace lines."
    ),
    policy: str = typer.Option(
        "lru",
        "--policy",
        help="Device eviction policy: lru, lfu, s3fifo, priority or one a plugin registers "
        "(comma-separated with --sweep).",
    ),
    host_cache_gib: str = typer.Option(
        "0",
        "--host-cache-gib",
        help="Host-memory tier per worker in GiB (0: none; comma-separated with --sweep).",
    ),
    host_policy: str = typer.Option("lru", "--host-policy", help="Host tier eviction policy."),
    pcie_gbps: float = typer.Option(
        25.0, "--pcie-gbps", help="Host-to-device GB/s of the TTFT cost model."
    ),
    replicas: int = REPLICAS_OPTION,
    router: str = ROUTER_OPTION,
    workers: int | None = WORKERS_OPTION,
    ray_address: str | None = RAY_OPTION,
) -> None:
    """Replay a request trace through the KV cache manager as vLLM 0.33 schedules it
    (arrival times, chunked prefill, vllm serve's batch limits for the GPU): hit rates,
    preemptions, usage. The whole trace by default; see --trace for the formats read."""
    from pagedkv.cli.plan import warn_above_limit
    from pagedkv.sim.replay_inputs import CacheOptions, TraceOptions, build_replay, check_fits

    trace_options = TraceOptions(trace, limit, trace_block_size, skip_bad_lines)
    cache = CacheOptions(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        block_size=block_size,
        max_model_len=parse_max_model_len(max_model_len),
        kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=enable_prefix_caching,
        hash_algo=hash_algo,
        retention=retention,
        revision=revision,
    )
    fleet = FleetOptions(replicas, router, workers, ray_address)
    outputs = OutputOptions(json_output, bound, sweep, plot, steps_csv)
    _check_choices(arrivals, scheduling_policy, retention)
    _check_outputs(outputs, fleet)
    tiers = parse_tier_options(policy, host_cache_gib, host_policy, pcie_gbps, gpu or DEFAULT_GPU)
    show = progress_enabled(json_output)
    settings = _scheduler_settings(
        gpu, max_num_seqs, max_num_batched_tokens, max_prefill_chunk,
        long_prefill_token_threshold, scheduling_policy, arrivals,
    )  # fmt: skip
    replay = build_replay(
        model,
        trace_options,
        cache,
        gpu=gpu,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        reading=lambda: phase(f"reading {trace}", None, show),
        warn_long=warn_above_limit,
    )
    check_fits(replay, num_blocks)
    _run(replay, settings, _with_cost_model(tiers, replay), fleet, outputs, show)


def _check_choices(arrivals: str, scheduling_policy: str, retention: str) -> None:
    if arrivals not in ("all", "timestamp"):
        raise ConfigError(f"--arrivals must be 'all' or 'timestamp', got {arrivals!r}")
    if scheduling_policy not in ("fcfs", "priority"):
        raise ConfigError(
            f"--scheduling-policy must be 'fcfs' or 'priority', got {scheduling_policy!r}"
        )
    check_retention(retention)


def _scheduler_settings(
    gpu: str | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_prefill_chunk: int | None,
    long_prefill_token_threshold: int,
    scheduling_policy: str,
    arrivals: str,
) -> SchedulerSettings:
    """The scheduler's settings; batch limits not given are vllm serve's for the GPU."""
    from pagedkv.sim.scheduling.scheduler import SchedulerSettings

    seqs, tokens = _scheduler_defaults(gpu)
    return SchedulerSettings(
        max_num_seqs=max_num_seqs or seqs,
        max_num_batched_tokens=max_num_batched_tokens or tokens,
        max_prefill_chunk=max_prefill_chunk,
        long_prefill_token_threshold=long_prefill_token_threshold,
        policy=scheduling_policy,  # type: ignore[arg-type]
        arrivals=arrivals,  # type: ignore[arg-type]
    )


def _scheduler_defaults(gpu: str | None) -> tuple[int, int]:
    """vllm serve's (max_num_seqs, max_num_batched_tokens) for ``gpu`` (default GPU if
    none: a --num-blocks run)."""
    from pagedkv.deployment import vllm_scheduler_defaults
    from pagedkv.models import get_gpu

    device = get_gpu(gpu or DEFAULT_GPU)
    return vllm_scheduler_defaults(device.memory_bytes, device.name)


def _with_cost_model(tiers: TierOptions, replay: Replay) -> TierOptions:
    """Everything the tier figures need, made and checked before the replay."""
    if not tiers.active:
        return tiers
    from pagedkv.sim.tiers import cost_model_for, host_blocks_for

    cost = cost_model_for(replay.setup, tiers.gpu, tiers.pcie_gbps, model=replay.model)
    for gib in tiers.host_gib:
        host_blocks_for(replay.setup, gib)
    return tiers._replace(cost=cost)


def _run(
    replay: Replay,
    settings: SchedulerSettings,
    tiers: TierOptions,
    fleet: FleetOptions,
    outputs: OutputOptions,
    show: bool,
) -> None:
    """One engine, a fleet, or a sweep of either, as the options ask."""
    if fleet.active:
        _run_fleet(replay, settings, tiers, fleet, outputs)
    elif outputs.sweep and tiers.active:
        progress = functools.partial(_tier_phase, show=show)
        run_tier_sweep(
            replay.setup, replay.trace, settings, tiers, outputs.plot, outputs.json_output,
            progress, fleet.workers, fleet.ray_address,
        )  # fmt: skip
    elif outputs.sweep:
        _run_sweep(replay, settings, outputs, fleet, show)
    else:
        _run_single(replay, settings, tiers, outputs, show)


def _run_fleet(
    replay: Replay,
    settings: SchedulerSettings,
    tiers: TierOptions,
    fleet: FleetOptions,
    outputs: OutputOptions,
) -> None:
    # Every replica gets the policy / host tier (one value each).
    setup = single_setup(replay.setup, tiers) if tiers.active else replay.setup
    run_fleet(
        setup, replay.trace, settings, replicas=fleet.replicas, router=fleet.router,
        sweep=outputs.sweep, bound=outputs.bound or outputs.sweep, plot=outputs.plot,
        json_output=outputs.json_output, workers=fleet.workers, ray_address=fleet.ray_address,
    )  # fmt: skip


def _run_single(
    replay: Replay,
    settings: SchedulerSettings,
    tiers: TierOptions,
    outputs: OutputOptions,
    show: bool,
) -> None:
    from pagedkv.sim.run import simulate

    setup = single_setup(replay.setup, tiers) if tiers.active else replay.setup
    with phase("replaying", len(replay.trace.requests), show) as bar:
        result = simulate(
            setup,
            replay.trace,
            settings,
            bound=outputs.bound,
            steps_path=outputs.steps_csv,
            progress=bar,
            stage=lambda name: bar.stage(f"computing the {name}"),
        )
    extra_rows, extra = tier_rows(result, setup, tiers) if tiers.active else ([], {})
    loaded = replay.trace
    if outputs.json_output:
        data = result.to_dict() | extra
        data["skipped_lines"] = loaded.num_skipped_lines
        data["notes"] = notes(result, loaded)
        print(json.dumps(data, indent=1))
    else:
        print_summary(result, loaded, extra_rows)
        if loaded.num_skipped_lines:
            stderr_console().print(f"skipped {loaded.num_skipped_lines} malformed trace lines")


def _tier_phase(total: int, description: str, show: bool) -> Any:
    return phase(description, total, show)


def _run_sweep(
    replay: Replay,
    settings: SchedulerSettings,
    outputs: OutputOptions,
    fleet: FleetOptions,
    show: bool,
) -> None:
    from pagedkv.sim.run import sweep as run_sweep
    from pagedkv.sim.run import sweep_sizes
    from pagedkv.sim.setup import bound_geometry

    setup, loaded = replay.setup, replay.trace
    sizes = sweep_sizes(setup.num_blocks)
    geometry = bound_geometry(setup.kv_cache_config)
    block_size = geometry.block_size if geometry else setup.config.block_size
    with phase("sweeping cache sizes", len(sizes), show) as update:
        points = run_sweep(
            setup,
            loaded,
            sizes,
            settings,
            bound=geometry is not None,
            progress=update,
            workers=fleet.workers,
            ray_address=fleet.ray_address,
        )
    if outputs.plot is not None:
        from pagedkv.sim.reports.plot import plot_sweep

        title = f"{setup.model_name}, {loaded.name} ({len(loaded.requests)} requests)"
        plot_sweep(points, outputs.plot, title=title, block_size=block_size)
    if outputs.json_output:
        rows = [p._asdict() | {"tokens": p.num_blocks * block_size} for p in points]
        print(json.dumps({"model": setup.model_name, "trace": loaded.name, "sweep": rows}))
    else:
        print_sweep(points, block_size)
