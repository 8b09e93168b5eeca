"""``pagedkv simulate``: replay a request trace through the KV cache manager."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from pagedkv.cli.common import (
    BLOCK_SIZE_OPTION,
    DEFAULT_GPU,
    JSON_OPTION,
    PP_OPTION,
    TP_OPTION,
    format_int,
    stderr_console,
    stdout_console,
)
from pagedkv.cli.simulate_fleet import (
    RAY_OPTION,
    REPLICAS_OPTION,
    ROUTER_OPTION,
    WORKERS_OPTION,
    run_fleet,
)
from pagedkv.errors import ConfigError

# One full-attention group keeps the default run short (a 31-group hybrid such as
# gemma-3-27b-it is ~30x slower per manager call); pass a model name for others.
DEFAULT_MODEL = "Llama-3.1-8B"
DEFAULT_LIMIT = 1000


def _engine(model: str, gpu: str | None, num_blocks: int | None, opts: dict[str, Any]) -> Any:
    from pagedkv.cli.plan import PlanRequest, make_plan
    from pagedkv.sim.engine import engine_from_model, engine_from_plan
    from pagedkv.sim.planned import PlanInputs

    if gpu is not None and num_blocks is not None:
        raise ConfigError("--gpu and --num-blocks are alternatives; give one")
    if num_blocks is not None:
        return engine_from_model(model, num_blocks=num_blocks, **opts)
    result = make_plan(
        PlanRequest(
            model=model,
            gpu=gpu,
            tensor_parallel_size=opts["tensor_parallel_size"],
            pipeline_parallel_size=opts["pipeline_parallel_size"],
            block_size=opts["block_size"],
            max_model_len=opts["max_model_len"],
        )
    )
    fixed = opts["max_model_len"] not in (None, -1)
    inputs = PlanInputs(result.config, result.kv_cache_specs, result.model_limit, fixed)
    config = result.config.replace(max_model_len=result.plan.max_model_len)
    return engine_from_plan(result.plan, config, result.layout.name, inputs)


def _progress(total: int, enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr_console(),
        transient=True,
        disable=not enabled,
    )


def _summary(result: Any) -> None:
    from rich.table import Table

    data = result.to_dict()
    table = Table(title=f"{result.model} on {result.trace}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("KV cache blocks", f"{format_int(result.num_blocks)} x {result.block_size} tokens"),
        ("requests (done / replayed)", f"{result.requests_done} / {result.requests}"),
        ("prompt tokens", format_int(result.prompt_tokens)),
        ("prefix-cache hit tokens", format_int(result.hit_tokens)),
        ("hit rate (tokens)", f"{100 * result.hit_rate:.2f} %"),
        ("hit rate (requests with a hit)", f"{100 * result.request_hit_rate:.2f} %"),
    ]
    if result.bound_hit_rate is not None:
        rows.append(("best possible hit rate (bound)", f"{100 * result.bound_hit_rate:.2f} %"))
    rows += [
        ("preemptions", format_int(result.preemptions)),
        (
            "block usage peak / mean",
            f"{100 * result.peak_usage:.1f} % / {100 * result.mean_usage:.1f} %",
        ),
        ("steps", format_int(result.steps)),
        ("manager calls", format_int(result.manager_calls)),
        (
            "manager time",
            f"{result.manager_seconds:.2f} s ({data['manager_calls_per_second']} calls/s)",
        ),
        ("wall time", f"{result.wall_seconds:.2f} s"),
    ]
    if result.evictions is not None:
        rows.insert(7, ("evictions", format_int(result.evictions)))
    for name, value in rows:
        table.add_row(name, value)
    stdout_console().print(table)


def _sweep_table(points: list[Any], block_size: int) -> None:
    from rich.table import Table

    table = Table(title="hit rate against KV cache size")
    for col in ("blocks", "tokens", "LRU hit rate", "bound hit rate", "preemptions"):
        table.add_column(col, justify="right")
    for p in points:
        bound = "-" if p.bound_hit_rate is None else f"{100 * p.bound_hit_rate:.2f} %"
        table.add_row(
            format_int(p.num_blocks),
            format_int(p.num_blocks * block_size),
            f"{100 * p.hit_rate:.2f} %",
            bound,
            format_int(p.preemptions),
        )
    stdout_console().print(table)


def simulate_command(
    model: str = typer.Argument(DEFAULT_MODEL, help="Bundled model name, directory or config."),
    trace: str = typer.Option(
        "mooncake_conversation",
        "--trace",
        help="Trace file (.jsonl Mooncake, .csv Azure, .gz ok), bundled name "
        "(mooncake_conversation, azure_conv, azure_code) or synthetic[:N[:SEED]].",
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"Size the cache as `pagedkv plan` does for this GPU [{DEFAULT_GPU}]."
    ),
    num_blocks: int | None = typer.Option(None, "--num-blocks", min=2, help="KV cache blocks."),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", min=1, help="Running requests cap."),
    max_num_batched_tokens: int = typer.Option(
        8192, "--max-num-batched-tokens", min=1, help="Token budget per step."
    ),
    max_prefill_chunk: int = typer.Option(
        2048, "--max-prefill-chunk", min=1, help="Most prompt tokens of one request per step."
    ),
    arrivals: str = typer.Option(
        "all", "--arrivals", help="all (every request waits at t=0) or timestamp."
    ),
    limit: int = typer.Option(
        DEFAULT_LIMIT, "--limit", min=0, help="Replay the first N requests (0: all)."
    ),
    tp: int = TP_OPTION,
    pp: int = PP_OPTION,
    block_size: int = BLOCK_SIZE_OPTION,
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Longer requests are rejected (counted)."
    ),
    hash_algo: str = typer.Option(
        "builtin", "--hash-algo", help="builtin (fast), xxhash128 or sha256_cbor."
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
    replicas: int = REPLICAS_OPTION,
    router: str = ROUTER_OPTION,
    workers: int | None = WORKERS_OPTION,
    ray_address: str | None = RAY_OPTION,
) -> None:
    """Replay a request trace through the KV cache manager: hit rates, preemptions, usage."""
    import dataclasses

    from pagedkv.sim.bundled import load_trace
    from pagedkv.sim.run import simulate
    from pagedkv.sim.scheduler import SchedulerSettings

    if arrivals not in ("all", "timestamp"):
        raise ConfigError(f"--arrivals must be 'all' or 'timestamp', got {arrivals!r}")
    if plot is not None and not sweep:
        raise ConfigError("--plot draws the --sweep; add --sweep")
    if (workers is not None or ray_address is not None) and not sweep:
        raise ConfigError("--workers and --ray run --sweep points; add --sweep")
    settings = SchedulerSettings(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_prefill_chunk=max_prefill_chunk,
        arrivals=arrivals,  # type: ignore[arg-type]
    )
    loaded = load_trace(trace, skip_bad_lines=skip_bad_lines).head(limit or None)
    opts = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "block_size": block_size,
        "max_model_len": max_model_len,
    }
    engine = dataclasses.replace(_engine(model, gpu, num_blocks, opts), hash_algo=hash_algo)
    show = sys.stderr.isatty()
    if replicas > 1 or router != "round-robin":
        run_fleet(
            engine, loaded, settings, replicas=replicas, router=router, sweep=sweep,
            bound=bound or sweep, plot=plot, json_output=json_output, workers=workers,
            ray_address=ray_address,
        )  # fmt: skip
        return
    if sweep:
        _run_sweep(engine, loaded, settings, plot, json_output, show, workers, ray_address)
        return
    total = len(loaded.requests)
    with _progress(total, show) as bar:
        task = bar.add_task("replaying", total=total)
        result = simulate(
            engine,
            loaded,
            settings,
            bound=bound,
            steps_path=steps_csv,
            progress=lambda done: bar.update(task, completed=done),
        )
    if json_output:
        data = result.to_dict()
        data["skipped_lines"] = loaded.num_skipped_lines
        print(json.dumps(data, indent=1))
    else:
        _summary(result)
        if loaded.num_skipped_lines:
            stderr_console().print(f"skipped {loaded.num_skipped_lines} malformed trace lines")


def _run_sweep(
    engine: Any,
    loaded: Any,
    settings: Any,
    plot: str | None,
    json_output: bool,
    show: bool,
    workers: int | None = None,
    ray_address: str | None = None,
) -> None:
    from pagedkv.sim.engine import bound_geometry
    from pagedkv.sim.run import sweep as run_sweep
    from pagedkv.sim.run import sweep_sizes

    sizes = sweep_sizes(engine.num_blocks)
    geometry = bound_geometry(engine.kv_cache_config)
    block_size = geometry[0] if geometry else engine.config.block_size
    with _progress(len(sizes), show) as bar:
        task = bar.add_task("sweeping cache sizes", total=len(sizes))
        points = run_sweep(
            engine,
            loaded,
            sizes,
            settings,
            bound=geometry is not None,
            progress=lambda done: bar.update(task, completed=done),
            workers=workers,
            ray_address=ray_address,
        )
    if plot is not None:
        from pagedkv.sim.plot import plot_sweep

        title = f"{engine.model_name}, {loaded.name} ({len(loaded.requests)} requests)"
        plot_sweep(points, plot, title=title, block_size=block_size)
    if json_output:
        rows = [p._asdict() | {"tokens": p.num_blocks * block_size} for p in points]
        print(json.dumps({"model": engine.model_name, "trace": loaded.name, "sweep": rows}))
    else:
        _sweep_table(points, block_size)
