"""Eviction policies and the host tier in the simulator: host size, a TTFT cost model,
and the sweep that crosses policies with device and host sizes.

Cost model (stated, simple): a request's time to first token is its prefill compute,
``(prompt tokens - hit tokens) / prefill tokens per s``, plus the copy of its host hit,
``host hit tokens * KV bytes per token / host-to-device bandwidth``; no queueing, no
overlap of copies with compute. Prefill throughput is ``MFU * peak dense BF16 FLOP/s /
(2 * parameters)`` (a forward pass costs about two FLOPs per parameter per token; the
attention term is left out, which flatters long prompts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.sim.engine import SimEngine
from pagedkv.sim.metrics import SimResult
from pagedkv.sim.run import simulate
from pagedkv.sim.scheduler import SchedulerSettings
from pagedkv.sim.trace import Trace

# Vendor peak dense BF16 tensor throughput (no sparsity), TFLOP/s, keyed like the GPU table.
PEAK_BF16_TFLOPS = {
    "A100-40GB": 312.0,
    "A100-80GB": 312.0,
    "H100-80GB": 989.0,
    "H200-141GB": 989.0,
    "B200": 2250.0,
    "L4": 121.0,
    "L40S": 362.0,
    "A10G": 125.0,
    "RTX-4090": 165.0,
    "MI300X": 1307.0,
}
DEFAULT_MFU = 0.5
DEFAULT_PCIE_GBPS = 25.0  # PCIe 4.0 x16, effective


def kv_bytes_per_token(engine: SimEngine) -> float:
    """KV bytes one token takes on one worker, every layer of every group."""
    groups = engine.kv_cache_config.kv_cache_groups
    return sum(
        g.kv_cache_spec.page_size_bytes * len(g.layer_names) / g.kv_cache_spec.block_size
        for g in groups
    )


def host_blocks_for(engine: SimEngine, host_gib: float) -> int:
    """Host blocks that ``host_gib`` GiB per worker holds (0 for 0)."""
    if host_gib < 0:
        raise ConfigError(f"--host-cache-gib must be >= 0, got {host_gib}")
    groups = [g for g in engine.kv_cache_config.kv_cache_groups if g.layer_names]
    per_block = max(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)
    return int(host_gib * 2**30 // per_block)


class CostModel(NamedTuple):
    prefill_tokens_per_s: float
    pcie_bytes_per_s: float
    kv_bytes_per_token: float

    def mean_ttft_s(
        self, num_requests: int, prompt_tokens: int, hit_tokens: int, host: int
    ) -> float:
        """Mean time to first token of ``num_requests`` requests (see the module text)."""
        if not num_requests:
            return 0.0
        compute = (prompt_tokens - hit_tokens) / self.prefill_tokens_per_s
        copy = host * self.kv_bytes_per_token / self.pcie_bytes_per_s
        return (compute + copy) / num_requests


def cost_model_for(
    engine: SimEngine, gpu: str, pcie_gbps: float = DEFAULT_PCIE_GBPS, mfu: float = DEFAULT_MFU
) -> CostModel:
    from pagedkv.models import describe_model
    from pagedkv.models.engine import bytes_per_param, estimate_weight_bytes

    tflops = PEAK_BF16_TFLOPS.get(gpu)
    if tflops is None:
        known = ", ".join(PEAK_BF16_TFLOPS)
        raise ConfigError(f"no peak BF16 FLOP/s for GPU {gpu!r} in the cost model; known: {known}")
    if pcie_gbps <= 0:
        raise ConfigError(f"--pcie-gbps must be positive, got {pcie_gbps}")
    layout = describe_model(engine.model_name)
    params = estimate_weight_bytes(layout) / bytes_per_param(layout)[0]
    return CostModel(
        mfu * tflops * 1e12 / (2 * params), pcie_gbps * 1e9, kv_bytes_per_token(engine)
    )


class TierPoint(NamedTuple):
    """One run of a sweep: the policy, both sizes and what it measured."""

    policy: str
    num_blocks: int
    host_num_blocks: int
    cache_tokens: int  # device + host capacity
    hit_rate: float
    host_hit_rate: float
    bound_hit_rate: float | None
    tiered_bound_hit_rate: float | None
    mean_ttft_s: float | None


def with_tiers(engine: SimEngine, policy: str, host_num_blocks: int, host_policy: str) -> SimEngine:
    return dataclasses.replace(
        engine, eviction_policy=policy, host_num_blocks=host_num_blocks, host_policy=host_policy
    )


def point_of(result: SimResult, engine: SimEngine, cost: CostModel | None) -> TierPoint:
    prompt = result.prompt_tokens or 1
    tiered = result.tiered_bound_hit_tokens
    ttft = None
    if cost is not None:
        ttft = cost.mean_ttft_s(
            result.admitted_requests,
            result.prompt_tokens,
            result.hit_tokens,
            result.host_hit_tokens,
        )
    from pagedkv.sim.engine import host_block_tokens

    tokens = (engine.num_blocks - 1) * result.block_size
    tokens += engine.host_num_blocks * host_block_tokens(engine)
    return TierPoint(
        engine.eviction_policy,
        engine.num_blocks,
        engine.host_num_blocks,
        tokens,
        result.hit_rate,
        result.host_hit_tokens / prompt,
        result.bound_hit_rate,
        None if tiered is None else tiered / prompt,
        ttft,
    )


def tier_sweep(
    engine: SimEngine,
    trace: Trace,
    settings: SchedulerSettings,
    policies: Sequence[str],
    device_sizes: Sequence[int],
    host_sizes: Sequence[int],
    *,
    host_policy: str = "lru",
    cost: CostModel | None = None,
    bound: bool = True,
    progress: Callable[[int], None] | None = None,
    workers: int | None = 1,
    ray_address: str | None = None,
) -> list[TierPoint]:
    """Every policy at every device block count and host block count; each run is an
    independent job (``sim.jobs``: ``workers`` local processes, 1: this process, None: one
    per CPU; or a Ray cluster), same results either way."""
    from pagedkv.sim.jobs import run_jobs

    engines = [
        with_tiers(engine.with_num_blocks(device), policy, host, host_policy)
        for device in device_sizes
        for host in host_sizes
        for policy in policies
    ]
    jobs = [(_tier_point, (e, trace, settings, bound, cost)) for e in engines]
    return run_jobs(jobs, workers=workers, ray_address=ray_address, progress=progress)


def _tier_point(
    engine: SimEngine,
    trace: Trace,
    settings: SchedulerSettings,
    bound: bool,
    cost: CostModel | None,
) -> TierPoint:
    return point_of(simulate(engine, trace, settings, bound=bound), engine, cost)


def plot_tier_sweep(points: Sequence[TierPoint], path: str, *, title: str) -> None:
    """Hit rate against total cache (device + host tokens): one line per policy and host
    size, the bound of a cache that large dashed."""
    from pagedkv.sim.plot import hit_rate_axes, new_figure, save_figure

    fig = new_figure(figsize=(7.5, 4.5), dpi=120)
    ax = fig.subplots()
    lines: dict[tuple[int, str], list[TierPoint]] = {}
    for p in points:
        lines.setdefault((p.host_num_blocks, p.policy), []).append(p)
    markers = "osD^v<>"
    policies = sorted({p.policy for p in points})
    for (host, policy), line in sorted(lines.items()):
        line.sort(key=lambda p: p.cache_tokens)
        label = policy if not host else f"{policy} + host {host:,} blocks"
        marker = markers[policies.index(policy) % len(markers)]
        style = f"{marker}-" if not host else f"{marker}:"
        xs = [p.cache_tokens for p in line]
        ax.plot(xs, [100 * p.hit_rate for p in line], style, label=label, alpha=0.85)
    for host, name, style in (
        (False, "bound, device only", "k--"),
        (True, "bound, device + host", "k-."),
    ):
        bound = sorted(
            {
                (p.cache_tokens, p.tiered_bound_hit_rate if host else p.bound_hit_rate)
                for p in points
                if bool(p.host_num_blocks) == host and p.policy == policies[0]
            }
        )
        if bound and all(b is not None for _, b in bound):
            ax.plot([t for t, _ in bound], [100 * (b or 0.0) for _, b in bound], style, label=name)
    hit_rate_axes(ax, xlabel="KV cache, device + host (tokens)", title=title, legend_size=7)
    fig.tight_layout()
    save_figure(fig, path)
