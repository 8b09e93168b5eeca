"""What `pagedkv plan` prints (PlanResult) and how: rich tables, one JSON object, or a plot."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.table import Table

from pagedkv.capacity import concurrency_points
from pagedkv.cli.common import format_bytes, format_int, stdout_console
from pagedkv.deployment import DeploymentPlan
from pagedkv.errors import ConfigError

__all__ = [
    "PLOT_POINTS",
    "SCHEMA_VERSION",
    "PlanResult",
    "plan_dict",
    "print_json",
    "weights_dtype",
    "vllm_lines",
    "vllm_kv_cache_tokens",
    "print_tables",
    "concurrency_curve",
    "concurrency_figure",
    "write_plot",
]

PLOT_POINTS = 32
# 2: max_concurrency is one number (vLLM's figure at max_model_len); the per-length
# table moved to concurrency_by_context_len; scheduler options added.
# 3: memory.terms (the start-up accounting's rows), vllm_kv_cache_tokens, weights_dtype.
SCHEMA_VERSION = 3


# What `pagedkv plan` prints is the library's plan.
PlanResult = DeploymentPlan


def plan_dict(result: PlanResult) -> dict[str, Any]:
    """The JSON document: inputs, memory terms, then the planner's report."""
    plan = result.kv_cache.to_dict()
    for group in plan["groups"]:
        group["layers"] = group.pop("layer_names")
    table = plan.pop("max_concurrency")
    at_max = result.kv_cache.concurrency_at(result.kv_cache.max_model_len)
    budget = result.budgets[0]
    memory = {**budget.to_dict(), "per_worker": [b.to_dict() for b in result.budgets]}
    scheduler = result.config.scheduler
    return {
        "schema_version": SCHEMA_VERSION,
        "model": result.layout.name,
        "gpu": result.gpu.name if result.gpu else None,
        "tensor_parallel_size": result.config.parallel.tensor_parallel_size,
        "pipeline_parallel_size": result.config.parallel.pipeline_parallel_size,
        "kv_cache_dtype": result.config.kv_cache_dtype,
        "num_params": result.layout.num_params,
        "layer_kinds": result.layout.layer_kinds(),
        # Fields the config.json left out, read from its model type's class defaults.
        "config_defaults": {
            "source": result.layout.defaults_from,
            "fields": dict(result.layout.filled_fields),
        },
        "memory": memory,
        "largest_max_model_len": result.largest_max_model_len,
        "model_max_model_len": result.model_limit,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "enable_prefix_caching": result.config.cache.enable_prefix_caching,
        **plan,
        # vLLM's "Maximum concurrency for N tokens per request" (null block counted).
        "max_concurrency": at_max.vllm_max_concurrency,
        # vLLM's "GPU KV cache size: N tokens" (null block counted).
        "vllm_kv_cache_tokens": vllm_kv_cache_tokens(result),
        "weights_dtype": weights_dtype(result),
        "concurrency_by_context_len": table,
    }


def print_json(result: PlanResult) -> None:
    print(json.dumps(plan_dict(result), indent=2))


def _memory_table(result: PlanResult) -> Table:
    b = result.budgets[0]
    table = Table(title="KV cache memory per worker", title_justify="left", show_header=False)
    table.add_column("term")
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("how")
    if b.device_bytes:
        gpu = result.gpu
        how = f"{gpu.name}: {gpu.planning_memory_source}" if gpu else "--memory"
        table.add_row("device memory", format_bytes(b.device_bytes), how)
        table.add_row(
            f"x utilization {b.gpu_memory_utilization:g}",
            format_bytes(b.usable_bytes),
            "rounded up",
        )
        params = f"{result.layout.num_params / 1e9:.2f}B params, {weights_dtype(result)}"
        table.add_row("- weights", format_bytes(b.weight_bytes), params)
        for term in b.terms:
            name = f"- {term.name}" if term.counted else f"  ({term.name})"
            table.add_row(name, format_bytes(term.bytes), term.how)
    how = "given (--kv-cache-memory-bytes)" if b.given else "what is left"
    table.add_row("= KV cache", format_bytes(b.kv_cache_bytes), how)
    return table


def weights_dtype(result: PlanResult) -> str:
    """The stored format: the checkpoint's quantisation, else the model dtype."""
    fmt = result.budgets[0].weight_format if result.budgets else "model dtype"
    if fmt == "model dtype":
        return result.layout.dtype
    if fmt.startswith("mxfp4 experts"):
        return f"{fmt}, {result.layout.dtype} rest"
    return fmt


def vllm_lines(result: PlanResult) -> tuple[str, str]:
    """vLLM's own start-up lines for this plan (null block counted, as vLLM does)."""
    at_max = result.kv_cache.concurrency_at(result.kv_cache.max_model_len)
    concurrency = at_max.vllm_max_concurrency or 0.0
    length = result.kv_cache.max_model_len
    return (
        f"GPU KV cache size: {vllm_kv_cache_tokens(result):,} tokens",
        f"Maximum concurrency for {length:,} tokens per request: {concurrency:.2f}x",
    )


def vllm_kv_cache_tokens(result: PlanResult) -> int:
    """vLLM 0.33's figure: int(num_blocks / blocks per max-length request x max_model_len)."""
    at_max = result.kv_cache.concurrency_at(result.kv_cache.max_model_len)
    return int((at_max.vllm_max_concurrency or 0.0) * result.kv_cache.max_model_len)


def _groups_table(result: PlanResult) -> Table:
    table = Table(title="KV cache groups (identical groups folded)", title_justify="left")
    kinds = [g.kind for g in result.kv_cache.groups]
    # Nothing in this table wraps: headers break where written, so a figure is never
    # cut at 80 columns or in a pipe.
    table.add_column("kind", no_wrap=True, min_width=max(map(len, kinds), default=4))
    for name in ("groups", "layers\neach", "block\nsize", "page\nbytes", "padding\nwaste"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("blocks\nper\nrequest", justify="right", no_wrap=True)
    rows: Counter[tuple[Any, ...]] = Counter()
    for g in result.kv_cache.groups:
        key = (g.kind, g.num_layers, g.block_size, g.page_size_bytes, g.waste_bytes)
        rows[(*key, g.waste_fraction, g.blocks_per_request)] += 1
    for (kind, layers, bs, page, waste, fraction, blocks), count in rows.items():
        share = f"\n({fraction:.1%})" if waste else ""
        table.add_row(
            kind,
            str(count),
            str(layers),
            str(bs),
            format_int(page),
            format_int(waste) + share,
            format_int(blocks),
        )
    length = result.kv_cache.max_model_len
    table.caption = f"blocks per request: one group's blocks for a {length:,}-token request"
    return table


def _summary_table(result: PlanResult) -> Table:
    plan = result.kv_cache
    table = Table(title="Capacity", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    bpb = plan.bytes_per_block
    fitted = " (auto-fitted)" if plan.max_model_len_auto_fitted else ""
    rows = [
        ("blocks per worker", f"{format_int(plan.num_blocks)} (1 null block)"),
        ("bytes per block", f"{format_int(bpb)} ({format_bytes(bpb)})"),
        ("scheduler block size", f"{plan.block_size} tokens"),
        ("token capacity at max_model_len", _count(plan.token_capacity)),
        ("max_model_len", format_int(plan.max_model_len) + fitted),
        ("largest max_model_len that fits", _largest(result)),
        ("padding waste per request", f"{plan.waste_fraction:.2%}"),
        ("KV replicas across TP ranks", str(plan.kv_tp_replicas)),
    ]
    if plan.full_attention_token_capacity is not None:
        full = format_int(plan.full_attention_token_capacity)
        rows.insert(4, ("tokens full-attention layers can hold", full))
    for row in rows:
        table.add_row(*row)
    return table


def _count(value: int | None) -> str:
    return "unbounded" if value is None else format_int(value)


def _largest(result: PlanResult) -> str:
    value = format_int(result.largest_max_model_len)
    if result.largest_max_model_len >= result.model_limit:
        own = result.model_limit == result.layout.max_model_len
        limit = "the model's limit" if own else "the length searched"
        return f">= {value} ({limit})"
    return value


def _concurrency_table(result: PlanResult) -> Table:
    table = Table(title="Max concurrency by context length", title_justify="left")
    for name in ("context", "blocks/request", "bytes/request", "max concurrency", "tokens"):
        table.add_column(name, justify="right")
    for p in sorted(result.kv_cache.max_concurrency, key=lambda p: p.context_len):
        table.add_row(
            format_int(p.context_len),
            format_int(p.blocks_per_request),
            format_bytes(p.bytes_per_request),
            "unbounded" if p.max_concurrency is None else f"{p.max_concurrency:.2f}x",
            _count(p.token_capacity),
        )
    return table


def _alternatives_table(result: PlanResult) -> Table:
    table = Table(title="Groupings the planner considered", title_justify="left")
    for name in ("", "grouping", "groups", "bytes/block", "waste", "bytes/request"):
        table.add_column(name, justify="left" if name in ("", "grouping") else "right")
    for alt in result.kv_cache.alternatives:
        table.add_row(
            "*" if alt.chosen else "",
            alt.name,
            str(alt.num_groups),
            format_bytes(alt.bytes_per_block),
            f"{alt.waste_fraction:.2%}",
            format_bytes(alt.bytes_per_request),
        )
    return table


def print_tables(result: PlanResult, plot: Path | None = None) -> None:
    console = stdout_console()
    config = result.config
    where = result.gpu.name if result.gpu else "given memory"
    kinds = ", ".join(f"{n} {k}" for k, n in result.layout.layer_kinds().items())
    console.print(
        f"[bold]{result.layout.name}[/bold] on {where}: TP {config.parallel.tensor_parallel_size}"
        f" x PP {config.parallel.pipeline_parallel_size}, KV {config.kv_cache_dtype}; {kinds}"
    )
    if result.layout.filled_fields:
        filled = ", ".join(f"{k} {_figure(v)}" for k, v in result.layout.filled_fields)
        console.print(f"left to the class defaults: {filled}")
    console.print(_memory_table(result))
    for line in vllm_lines(result):
        console.print(f"vLLM would log: {line}", markup=False)
    console.print(_groups_table(result))
    console.print(_summary_table(result))
    console.print(_concurrency_table(result))
    if len(result.kv_cache.alternatives) > 1:
        console.print(_alternatives_table(result))
    if plot is not None:
        console.print(f"plot written to {plot}")


def _figure(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def concurrency_curve(result: PlanResult) -> list[tuple[int, float]]:
    """(context length, max concurrency) at log-spaced lengths, from the plan's one pass."""
    top = result.kv_cache.max_model_len
    low = max(result.kv_cache.block_size, 16)
    lengths = sorted(
        {max(1, int(low * (top / low) ** (i / (PLOT_POINTS - 1)))) for i in range(PLOT_POINTS)}
    )
    return sorted(
        (p.context_len, p.max_concurrency)
        for p in concurrency_points(result.kv_cache, lengths)
        if p.max_concurrency is not None
    )


def concurrency_figure(result: PlanResult) -> Any:
    """Max concurrency against context length as a matplotlib Figure (no pyplot, no
    global backend: safe in notebooks, where the returned figure displays itself)."""
    from matplotlib.figure import Figure

    points = concurrency_curve(result)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens per request)")
    ax.set_ylabel("max concurrent requests")
    where = result.gpu.name if result.gpu else "given memory"
    ax.set_title(f"{result.layout.name} on {where}: KV cache capacity")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def write_plot(result: PlanResult, path: Path) -> None:
    try:
        fig = concurrency_figure(result)
    except ImportError:
        raise ConfigError("--plot needs matplotlib (pip install 'pagedkv[plot]')") from None
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise ConfigError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
