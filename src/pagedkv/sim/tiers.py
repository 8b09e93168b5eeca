"""Eviction policies and the host tier in the simulator: host size, a TTFT cost model,
and the sweep that crosses policies with device and host sizes.

Cost model (stated, simple): a request's time to first token is its prefill compute,
``(prompt tokens - hit tokens) / prefill tokens per s``, plus the copy of its host hit,
``host hit tokens * KV bytes per token / host-to-device bandwidth``; no queueing, no
overlap of copies with compute. Prefill throughput is ``MFU * peak dense BF16 FLOP/s *
tensor-parallel GPUs / (2 * active parameters)`` (a forward pass costs about two FLOPs per
parameter a token passes through: all of a dense model's, the routed share of a MoE's
experts; tensor parallelism splits each token's FLOPs over its GPUs; the attention term is
left out, which flatters long prompts).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.sim.reports.metrics import SimResult
from pagedkv.sim.run import simulate
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "PEAK_BF16_TFLOPS",
    "DEFAULT_MFU",
    "DEFAULT_PCIE_GBPS",
    "MAX_HOST_BLOCKS",
    "kv_bytes_per_token",
    "check_host_gib",
    "host_blocks_for",
    "active_params",
    "CostModel",
    "check_pcie_gbps",
    "peak_tflops",
    "cost_model_for",
    "TierPoint",
    "with_tiers",
    "point_of",
    "tier_sweep",
    "PlotLine",
    "tier_plot_lines",
    "plot_tier_sweep",
]

# Vendor peak dense BF16 tensor throughput (no sparsity), TFLOP/s, keyed like the GPU
# table (``pagedkv gpus``; aliases resolve through it).
PEAK_BF16_TFLOPS = {
    "A100-40GB": 312.0,
    "A100-80GB": 312.0,
    "H100-80GB": 989.0,
    "H100-PCIe": 756.0,
    "H100-NVL": 835.0,
    "H20": 148.0,
    "H200-141GB": 989.0,
    "GH200-96GB": 989.0,
    "GH200-141GB": 989.0,
    "B200": 2250.0,
    "GB200": 2500.0,
    "L4": 121.0,
    "L40S": 362.0,
    "A10": 125.0,
    "A10G": 125.0,
    "RTX-4090": 165.0,
    "MI250X": 383.0,
    "MI300X": 1307.0,
    "MI325X": 1307.0,
}
DEFAULT_MFU = 0.5
DEFAULT_PCIE_GBPS = 25.0  # PCIe 4.0 x16, effective
# The host pool keeps a Python object per block, as the device pool does.
MAX_HOST_BLOCKS = 2**24
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")


def kv_bytes_per_token(setup: SimSetup) -> float:
    """KV bytes one token takes on one worker, every layer of every group."""
    groups = setup.kv_cache_config.kv_cache_groups
    return sum(
        g.kv_cache_spec.page_size_bytes * len(g.layer_names) / g.kv_cache_spec.block_size
        for g in groups
    )


def check_host_gib(host_gib: float) -> None:
    """A host tier size must be a finite number of GiB >= 0."""
    if not isinstance(host_gib, int | float) or not math.isfinite(host_gib) or host_gib < 0:
        raise ConfigError(f"--host-cache-gib must be a finite number >= 0, got {host_gib}")


def host_blocks_for(setup: SimSetup, host_gib: float) -> int:
    """Host blocks that ``host_gib`` GiB per worker holds (0 for 0); more than
    ``MAX_HOST_BLOCKS`` is refused here, before any replay allocates them."""
    check_host_gib(host_gib)
    groups = [g for g in setup.kv_cache_config.kv_cache_groups if g.layer_names]
    per_block = max(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)
    blocks = int(host_gib * 2**30 // per_block)
    if blocks > MAX_HOST_BLOCKS:
        most = MAX_HOST_BLOCKS * per_block / 2**30
        raise ConfigError(
            f"--host-cache-gib {host_gib:g} is {blocks:,} host blocks of {per_block:,} bytes, "
            f"more than the {MAX_HOST_BLOCKS:,} the simulator keeps (one object each); "
            f"give at most {most:,.0f} GiB"
        )
    return blocks


def active_params(model: Any) -> float:
    """Parameters one token passes through: all of them for a dense model; for a MoE,
    the dense part plus ``experts per token / experts`` of the expert weights (the
    config's ``num_experts_per_tok`` and expert count)."""
    from pagedkv.models import describe_model, load_model_config

    source = load_model_config(model)
    layout = describe_model(source)
    total = float(layout.num_params)
    experts = sum(u.expert_params for u in layout.units)
    if not experts:
        return total
    config = source.text_config
    num_experts = next((config[k] for k in _EXPERT_COUNT_KEYS if config.get(k)), 0)
    per_token = next((config[k] for k in _EXPERTS_PER_TOKEN_KEYS if config.get(k)), 0)
    if not num_experts or not per_token:
        return total
    idle = experts * (1 - min(per_token / num_experts, 1.0))
    return total * (1 - idle / layout.config_params) if layout.config_params else total


class CostModel(NamedTuple):
    prefill_tokens_per_s: float
    pcie_bytes_per_s: float
    kv_bytes_per_token: float

    def mean_ttft_s(
        self, num_requests: int, prompt_tokens: int, hit_tokens: int, host: int
    ) -> float:
        """Mean time to first token of ``num_requests`` requests (see the module text).

        Args:
            num_requests: requests served.
            prompt_tokens: their prompt tokens in all.
            hit_tokens: prompt tokens served from a cache (device or host).
            host: hit tokens copied from the host tier.
        """
        if not num_requests:
            return 0.0
        compute = (prompt_tokens - hit_tokens) / self.prefill_tokens_per_s
        copy = host * self.kv_bytes_per_token / self.pcie_bytes_per_s
        return (compute + copy) / num_requests


def check_pcie_gbps(pcie_gbps: float) -> None:
    if not isinstance(pcie_gbps, int | float) or not math.isfinite(pcie_gbps) or pcie_gbps <= 0:
        raise ConfigError(f"--pcie-gbps must be a finite number > 0, got {pcie_gbps}")


def peak_tflops(gpu: str) -> float:
    """Peak dense BF16 TFLOP/s of ``gpu`` (a GPU table name or alias)."""
    from pagedkv.models import get_gpu

    name = get_gpu(gpu).name
    tflops = PEAK_BF16_TFLOPS.get(name)
    if tflops is None:
        known = ", ".join(PEAK_BF16_TFLOPS)
        raise ConfigError(
            f"no peak BF16 FLOP/s for GPU {name!r} in the TTFT cost model; known: {known}"
        )
    return tflops


def cost_model_for(
    setup: SimSetup,
    gpu: str,
    pcie_gbps: float = DEFAULT_PCIE_GBPS,
    mfu: float = DEFAULT_MFU,
    *,
    model: Any = None,
) -> CostModel:
    """The TTFT cost model of ``setup`` on ``gpu``; ``model`` is what the setup was
    planned from (a ModelSource, directory or name; default: the setup's model name).
    Tensor parallelism is the engine config's.

    Args:
        setup: what the simulation runs on (config, KV bytes per token).
        gpu: the GPU's name, for its peak TFLOPS.
        pcie_gbps: host-to-device bandwidth, in GB/s.
        mfu: the fraction of the GPU's peak FLOPS prefill achieves.
        model: what the setup was planned from (None: the setup's model name).
    """
    check_pcie_gbps(pcie_gbps)
    tflops = peak_tflops(gpu)
    params = active_params(setup.model_name if model is None else model)
    tp = setup.config.parallel.tensor_parallel_size
    return CostModel(
        mfu * tflops * 1e12 * tp / (2 * params), pcie_gbps * 1e9, kv_bytes_per_token(setup)
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
    device_tokens: int = 0  # device capacity alone


def with_tiers(setup: SimSetup, policy: str, host_num_blocks: int, host_policy: str) -> SimSetup:
    """``setup`` with a device eviction policy and a host tier.

    Args:
        setup: what the simulation runs on.
        policy: the device pool's eviction policy.
        host_num_blocks: host tier blocks (0: none).
        host_policy: the host tier's eviction policy.
    """
    return dataclasses.replace(
        setup, eviction_policy=policy, host_num_blocks=host_num_blocks, host_policy=host_policy
    )


def point_of(result: SimResult, setup: SimSetup, cost: CostModel | None) -> TierPoint:
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
    from pagedkv.sim.setup import host_block_tokens

    device = (setup.num_blocks - 1) * result.block_size
    tokens = device + setup.host_num_blocks * host_block_tokens(setup)
    return TierPoint(
        setup.eviction_policy,
        setup.num_blocks,
        setup.host_num_blocks,
        tokens,
        result.hit_rate,
        result.host_hit_tokens / prompt,
        result.bound_hit_rate,
        None if tiered is None else tiered / prompt,
        ttft,
        device,
    )


def tier_sweep(
    setup: SimSetup,
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
    per CPU; or a Ray cluster), same results either way.

    Args:
        setup: what the simulation runs on; each point resizes it.
        trace: the requests replayed.
        settings: the scheduler settings.
        policies: device eviction policies to run.
        device_sizes: device block counts.
        host_sizes: host tier block counts (0: no host tier).
        host_policy: the host tier's eviction policy.
        cost: the TTFT cost model (None: no TTFT estimate).
        bound: also compute the clairvoyant hit counts.
        progress: called with the number of runs done.
        workers: local processes (None: one per CPU, 1: this process).
        ray_address: a Ray cluster to run on instead (None: local).
    """
    from pagedkv.sim.jobs import run_jobs

    setups = [
        with_tiers(setup.with_num_blocks(device), policy, host, host_policy)
        for device in device_sizes
        for host in host_sizes
        for policy in policies
    ]
    jobs = [(_tier_point, (e, trace, settings, bound, cost)) for e in setups]
    return run_jobs(jobs, workers=workers, ray_address=ray_address, progress=progress)


def _tier_point(
    setup: SimSetup,
    trace: Trace,
    settings: SchedulerSettings,
    bound: bool,
    cost: CostModel | None,
) -> TierPoint:
    return point_of(simulate(setup, trace, settings, bound=bound), setup, cost)


class PlotLine(NamedTuple):
    label: str
    style: str
    device_tokens: list[int]
    hit_rates: list[float]  # percent


def tier_plot_lines(points: Sequence[TierPoint]) -> list[PlotLine]:
    """The lines of the tier sweep plot, against the *device* cache size: one per policy
    and host size (dotted with a host tier) and each host size's bound (dashed). A host
    tier is a line of its own rather than a shift to the right: on the log axis, device
    plus a host tier many times larger would pile every host point at the right edge."""
    out: list[PlotLine] = []
    lines: dict[tuple[int, str], list[TierPoint]] = {}
    for p in points:
        lines.setdefault((p.host_num_blocks, p.policy), []).append(p)
    markers = "osD^v<>"
    policies = sorted({p.policy for p in points})
    for (host, policy), line in sorted(lines.items()):
        line.sort(key=lambda p: p.num_blocks)
        label = policy if not host else f"{policy} + host {host:,} blocks"
        marker = markers[policies.index(policy) % len(markers)]
        style = f"{marker}-" if not host else f"{marker}:"
        xs = [_device_tokens(p) for p in line]
        out.append(PlotLine(label, style, xs, [100 * p.hit_rate for p in line]))
    for host in sorted({p.host_num_blocks for p in points}):
        bound = sorted(
            (_device_tokens(p), p.tiered_bound_hit_rate if host else p.bound_hit_rate)
            for p in points
            if p.host_num_blocks == host and p.policy == policies[0]
        )
        if not bound or any(b is None for _, b in bound):
            continue
        name = "bound, device only" if not host else f"bound, device + host {host:,} blocks"
        ys = [100 * (b or 0.0) for _, b in bound]
        out.append(PlotLine(name, "k--" if not host else "k-.", [t for t, _ in bound], ys))
    return out


def _device_tokens(point: TierPoint) -> int:
    return point.device_tokens


def plot_tier_sweep(points: Sequence[TierPoint], path: str, *, title: str) -> None:
    """Hit rate against the device cache size (``tier_plot_lines``)."""
    from pagedkv.sim.reports.plot import hit_rate_axes, new_figure, save_figure

    fig = new_figure(figsize=(7.5, 4.5), dpi=120)
    ax = fig.subplots()
    for line in tier_plot_lines(points):
        ax.plot(line.device_tokens, line.hit_rates, line.style, label=line.label, alpha=0.85)
    hit_rate_axes(ax, xlabel="KV cache on the device (tokens)", title=title, legend_size=7)
    fig.tight_layout()
    save_figure(fig, path)
