"""``pagedkv simulate --policy/--host-cache-gib/--pcie-gbps``: eviction policies and the
host tier in a replay (the logic lives in pagedkv.sim.tiers; this module parses and prints)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from pagedkv.cli.common import format_int, format_percent, stdout_console
from pagedkv.errors import ConfigError

__all__ = [
    "TierOptions",
    "parse_tier_options",
    "single_setup",
    "tier_rows",
    "run_tier_sweep",
]


class TierOptions(NamedTuple):
    policies: list[str]
    host_gib: list[float]
    host_policy: str
    pcie_gbps: float
    gpu: str
    cost: Any = None  # the TTFT cost model, made before the replay (None: make it after)

    @property
    def active(self) -> bool:
        """Anything other than vLLM's LRU on the device alone."""
        return self.policies != ["lru"] or any(self.host_gib)


def parse_tier_options(
    policy: str, host_cache_gib: str, host_policy: str, pcie_gbps: float, gpu: str
) -> TierOptions:
    """The ``--policy``/``--host-cache-gib`` options checked and split into lists.

    Args:
        policy: device eviction policies, comma-separated.
        host_cache_gib: host tier sizes in GiB, comma-separated.
        host_policy: the host tier's eviction policy.
        pcie_gbps: host-to-device bandwidth, in GB/s, for the TTFT estimate.
        gpu: the GPU's name, for the TTFT estimate.
    """
    from pagedkv.policies import policy_names

    policies = [p.strip() for p in policy.split(",") if p.strip()]
    known = policy_names()
    for name in [*policies, host_policy]:
        if name not in known:
            raise ConfigError(f"unknown eviction policy {name!r}; known: {', '.join(known)}")
    try:
        sizes = [float(x) for x in host_cache_gib.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--host-cache-gib takes GiB numbers (comma-separated with --sweep), "
            f"got {host_cache_gib!r}"
        ) from None
    if not policies or not sizes:
        raise ConfigError("--policy and --host-cache-gib need at least one value")
    from pagedkv.sim.tiers import check_host_gib, check_pcie_gbps

    for size in sizes:
        check_host_gib(size)
    check_pcie_gbps(pcie_gbps)
    return TierOptions(policies, sizes, host_policy, pcie_gbps, gpu)


def single_setup(setup: Any, opts: TierOptions) -> Any:
    """The setup of one run; a list of values belongs to --sweep."""
    from pagedkv.sim.tiers import host_blocks_for, with_tiers

    if len(opts.policies) > 1 or len(opts.host_gib) > 1:
        raise ConfigError("several --policy or --host-cache-gib values need --sweep")
    host = host_blocks_for(setup, opts.host_gib[0])
    return with_tiers(setup, opts.policies[0], host, opts.host_policy)


def tier_rows(
    result: Any, setup: Any, opts: TierOptions
) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Summary rows and JSON fields: hits per tier, prefill saved, estimated TTFT."""
    from pagedkv.sim.tiers import cost_model_for, point_of

    cost = opts.cost or cost_model_for(setup, opts.gpu, opts.pcie_gbps)
    point = point_of(result, setup, cost)
    prompt = result.prompt_tokens or 1
    device_hits = result.hit_tokens - result.host_hit_tokens
    no_cache = cost.mean_ttft_s(result.admitted_requests, result.prompt_tokens, 0, 0)
    bound_ttft = None
    best = result.tiered_bound_hit_tokens or result.bound_hit_tokens
    if best is not None:
        bound_ttft = cost.mean_ttft_s(result.admitted_requests, result.prompt_tokens, best, 0)
    rows = [
        ("eviction policy", setup.eviction_policy),
        (
            "host tier",
            f"{format_int(setup.host_num_blocks)} blocks ({setup.host_policy})"
            if setup.host_num_blocks
            else "none",
        ),
        (
            "hit tokens on device",
            f"{format_int(device_hits)} ({format_percent(device_hits / prompt)})",
        ),
        (
            "hit tokens on host",
            f"{format_int(result.host_hit_tokens)} ({format_percent(point.host_hit_rate)})",
        ),
        ("prefill tokens saved", format_int(result.hit_tokens)),
        ("est. mean TTFT (no cache)", f"{1000 * no_cache:.1f} ms"),
        ("est. mean TTFT", f"{1000 * (point.mean_ttft_s or 0.0):.1f} ms"),
    ]
    if point.tiered_bound_hit_rate is not None:
        rows.append(("bound, device + host size", format_percent(point.tiered_bound_hit_rate)))
    if bound_ttft is not None:
        rows.append(("est. mean TTFT at the bound", f"{1000 * bound_ttft:.1f} ms"))
    data = {
        "eviction_policy": setup.eviction_policy,
        "host_num_blocks": setup.host_num_blocks,
        "host_policy": setup.host_policy,
        "device_hit_tokens": device_hits,
        "prefill_tokens_saved": result.hit_tokens,
        "cost_model": cost._asdict(),
        "mean_ttft_s_no_cache": round(no_cache, 6),
        "mean_ttft_s": round(point.mean_ttft_s or 0.0, 6),
        "mean_ttft_s_bound": None if bound_ttft is None else round(bound_ttft, 6),
    }
    return rows, data


def run_tier_sweep(
    setup: Any,
    loaded: Any,
    settings: Any,
    opts: TierOptions,
    plot: str | None,
    json_output: bool,
    progress: Callable[[int, str], Any],
    workers: int | None = None,
    ray_address: str | None = None,
) -> None:
    """Every policy x device size (1/8x .. 4x) x host size; a table (or JSON) and a plot.

    Args:
        setup: what the simulation runs on; each point resizes it.
        loaded: the trace replayed.
        settings: the scheduler settings.
        opts: the policies, host sizes and cost inputs from the command line.
        plot: the PNG file the sweep is plotted to (None: no plot).
        json_output: print JSON instead of a table.
        progress: a context manager factory taking (total, label) and yielding an update callback.
        workers: local processes (None: one per CPU, 1: this process).
        ray_address: a Ray cluster to run on instead (None: local).
    """
    from pagedkv.sim.run import sweep_sizes
    from pagedkv.sim.setup import bound_geometry
    from pagedkv.sim.tiers import cost_model_for, host_blocks_for, plot_tier_sweep, tier_sweep

    sizes = sweep_sizes(setup.num_blocks)
    hosts = sorted({host_blocks_for(setup, g) for g in opts.host_gib})
    cost = opts.cost or cost_model_for(setup, opts.gpu, opts.pcie_gbps)
    total = len(sizes) * len(hosts) * len(opts.policies)
    with progress(total, "sweeping policies and sizes") as update:
        points = tier_sweep(
            setup,
            loaded,
            settings,
            opts.policies,
            sizes,
            hosts,
            host_policy=opts.host_policy,
            cost=cost,
            # as the plain sweep: no bound without a full-attention group
            bound=bound_geometry(setup.kv_cache_config) is not None,
            progress=update,
            workers=workers,
            ray_address=ray_address,
        )
    if plot is not None:
        title = f"{setup.model_name}, {loaded.name} ({len(loaded.requests)} requests)"
        plot_tier_sweep(points, plot, title=title)
    if json_output:
        rows = [p._asdict() for p in points]
        print(json.dumps({"model": setup.model_name, "trace": loaded.name, "sweep": rows}))
        return
    _tier_table(points)


def _tier_table(points: list[Any]) -> None:
    from rich.table import Table

    table = Table(title="hit rate by policy, device and host size")
    columns = ("policy", "device blocks", "host blocks", "cache tokens", "hit rate")
    for col in (*columns, "from host", "bound", "est. TTFT"):
        table.add_column(col, justify="right")
    for p in points:
        bound = p.tiered_bound_hit_rate if p.host_num_blocks else p.bound_hit_rate
        table.add_row(
            p.policy,
            format_int(p.num_blocks),
            format_int(p.host_num_blocks),
            format_int(p.cache_tokens),
            format_percent(p.hit_rate),
            format_percent(p.host_hit_rate),
            format_percent(bound),
            "-" if p.mean_ttft_s is None else f"{1000 * p.mean_ttft_s:.1f} ms",
        )
    stdout_console().print(table)
