"""What a simulation runs on: a planned KV cache config and the engine options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedkv.capacity.plan import full_attention_token_capacity, inner_specs, is_full_attention
from pagedkv.capacity.report import KVCachePlan
from pagedkv.config import EngineConfig
from pagedkv.deployment import DeploymentPlan, PlanRequest
from pagedkv.errors import ConfigError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.sim.planned import PlanInputs, plan_inputs_for, plan_with_num_blocks
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.scheduling.simulator import Simulator
from pagedkv.specs import MambaSpec

__all__ = [
    "BoundGeometry",
    "bound_geometry",
    "host_block_tokens",
    "SimSetup",
    "setup_from_plan",
    "setup_from_deployment",
    "setup_from_model",
    "setup_from_request",
]


def _group_label(group: Any) -> str:
    spec = group.kv_cache_spec
    return f"{type(spec).__name__}x{len(group.layer_names)}"


class BoundGeometry(NamedTuple):
    """The cache the clairvoyant bound replays against."""

    block_size: int  # tokens
    capacity_blocks: int


def bound_geometry(kv_cache_config: KVCacheConfig) -> BoundGeometry | None:
    """Block size and capacity in blocks for the clairvoyant bound, or None without a
    full-attention group (a window hit does not need the whole prefix, so no chain bound).

    The capacity is the planner's ``full_attention_token_capacity`` (every full-attention
    group stores each cached token once) in blocks of the smallest full-attention block
    size: a finer grain than any group caches at, so the bound stays an upper bound, and
    neither depends on the order of the groups.
    """
    groups = kv_cache_config.kv_cache_groups
    num_tokens = full_attention_token_capacity(groups, kv_cache_config.num_blocks)
    if num_tokens is None:
        return None
    block_size = min(
        g.kv_cache_spec.block_size
        for g in groups
        if g.layer_names and not g.host_resident and is_full_attention(g.kv_cache_spec)
    )
    return BoundGeometry(block_size, num_tokens // block_size)


def host_block_tokens(setup: SimSetup) -> int:
    """Tokens one host block holds: each full-attention group's block goes to a host block
    of its own, so a token takes one host block slot per group."""
    groups = [g for g in setup.kv_cache_config.kv_cache_groups if g.layer_names]
    size = groups[0].kv_cache_spec.block_size if groups else 1
    return max(size // max(len(groups), 1), 1)


def _mamba_align_block_size(kv_cache_config: KVCacheConfig) -> int:
    """The Mamba block size when Mamba groups checkpoint per block ("align"), else 0."""
    sizes = [
        spec.block_size
        for g in kv_cache_config.kv_cache_groups
        for spec in inner_specs(g.kv_cache_spec)[:1]
        if isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align"
    ]
    return min(sizes, default=0)


@dataclass(frozen=True, kw_only=True)
class SimSetup:
    """What a simulation runs on: a KV cache config plus the engine options.

    Not an engine itself: each ``simulator()`` builds a fresh simulated engine (a new
    manager and its scheduler loop) from it; a fleet's replicas all start from one."""

    kv_cache_config: KVCacheConfig
    config: EngineConfig
    model_name: str = "model"
    hash_algo: str | None = None
    plan_inputs: PlanInputs | None = None
    # what stays cached: "vllm" (vLLM 0.33's sparse retention) or "dense"; None: the
    # config's ``prefix_cache_retention``
    retention: str | None = None
    # Device eviction policy and host tier (pagedkv.policies); the defaults are vLLM's.
    eviction_policy: str = "lru"
    host_num_blocks: int = 0
    host_policy: str = "lru"

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks

    @property
    def max_model_len(self) -> int:
        planned = self.kv_cache_config.max_model_len
        return planned if planned and planned > 0 else self.config.max_model_len

    def with_num_blocks(self, num_blocks: int) -> SimSetup:
        """The same model with another block count (sweeps): planned again through the
        planner when the setup knows its planning inputs, so tensors, block count and
        ``max_model_len`` agree. A hand-built config is resized only if it has no tensors
        (a layout-only config: nothing else depends on the block count)."""
        if self.plan_inputs is not None:
            plan, config = plan_with_num_blocks(self.plan_inputs, num_blocks)
            return dataclasses.replace(self, kv_cache_config=plan.configs[0], config=config)
        if self.kv_cache_config.kv_cache_tensors:
            raise ConfigError(
                "SimSetup.with_num_blocks: this hand-built KVCacheConfig has tensors sized "
                "for its block count and no planning inputs to plan it again; build it with "
                "setup_from_model, or pass a config without tensors"
            )
        cfg = dataclasses.replace(self.kv_cache_config, num_blocks=num_blocks)
        return dataclasses.replace(self, kv_cache_config=cfg)

    def simulator(
        self, settings: SchedulerSettings | None = None, *, enable_events: bool = False
    ) -> Simulator:
        """A simulator over a new, empty ``KVCacheManager`` (publishing KV events with
        ``enable_events``, for a fleet's router)."""
        from pagedkv.policies import make_kv_cache_manager
        from pagedkv.runtime import Request

        settings = settings or SchedulerSettings()
        config = self.config.replace(
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
        )
        # "lru" without a host tier is a plain KVCacheManager with the runtime's own queue
        manager: Any = make_kv_cache_manager(
            self.kv_cache_config,
            config,
            policy=self.eviction_policy,
            host_num_blocks=self.host_num_blocks,
            host_policy=self.host_policy,
            hash_algo=self.hash_algo,
            retention=self.retention,
            enable_events=enable_events,
        )
        hasher = manager.hasher if manager.enable_caching else None

        def make_request(request_id: str, token_ids: list[int]) -> Any:
            return Request(request_id, token_ids, hasher=hasher)

        geometry = bound_geometry(self.kv_cache_config)
        return Simulator(
            manager,
            make_request=make_request,
            max_model_len=manager.max_model_len,
            block_size=geometry.block_size if geometry else manager.hash_block_size,
            num_blocks=self.num_blocks,
            settings=settings,
            model_name=self.model_name,
            kv_cache_groups=tuple(_group_label(g) for g in self.kv_cache_config.kv_cache_groups),
            align_block_size=_mamba_align_block_size(self.kv_cache_config),
        )


def setup_from_plan(
    plan: KVCachePlan,
    config: EngineConfig,
    model_name: str,
    plan_inputs: PlanInputs | None = None,
) -> SimSetup:
    """Simulate on worker 0's planned config (every worker has the same block count);
    with ``plan_inputs`` (what the plan was made from) ``with_num_blocks`` plans again.

    Args:
        plan: the KV cache plan; worker 0's config is simulated.
        config: the engine config the plan was made with.
        model_name: the model's name, for reports.
        plan_inputs: what the plan was made from (None: ``with_num_blocks`` cannot plan again).
    """
    return SimSetup(
        kv_cache_config=plan.configs[0],
        config=config,
        model_name=model_name,
        plan_inputs=plan_inputs,
    )


def setup_from_deployment(result: DeploymentPlan, *, fixed_max_model_len: bool) -> SimSetup:
    """Simulate on a ``pagedkv.plan`` result: its worker-0 config, at the planned
    max_model_len, able to plan again for another block count (sweeps)."""
    inputs = PlanInputs(
        result.config, result.kv_cache_specs, result.model_limit, fixed_max_model_len
    )
    config = result.config.replace(max_model_len=result.kv_cache.max_model_len)
    return setup_from_plan(result.kv_cache, config, result.layout.name, inputs)


def setup_from_request(request: PlanRequest) -> tuple[SimSetup, DeploymentPlan]:
    """Plan ``request`` as ``pagedkv plan`` does and simulate on the plan; returns the
    setup and the plan (whose ``above_model_limit`` a caller may warn about)."""
    from pagedkv.deployment import plan_model

    result = plan_model(request)
    fixed = request.flags.max_model_len not in (None, -1)
    return setup_from_deployment(result, fixed_max_model_len=fixed), result


def setup_from_model(
    model: str,
    *,
    gpu: str | None = None,
    num_blocks: int | None = None,
    kv_cache_bytes: int | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> SimSetup:
    """Plan the model's KV cache as ``pagedkv.plan`` (and ``pagedkv plan``) does: for
    ``gpu`` (its memory minus weights and the activation reserve), for ``kv_cache_bytes``
    per worker, or with ``num_blocks`` given directly (``num_gpu_blocks_override``).
    ``max_num_seqs`` / ``max_num_batched_tokens`` size the activation reserve (None:
    vLLM's defaults for the GPU). With ``num_blocks`` and no ``max_model_len`` the planner
    fits the length to the blocks (at most the model's); with an explicit
    ``max_model_len`` too small a count is an ``InsufficientMemoryError``.

    Args:
        model: bundled name, directory, config.json or Hub id.
        gpu: the GPU planned for (one of ``gpu``, ``num_blocks``, ``kv_cache_bytes``).
        num_blocks: KV cache blocks, the null block included (at least 2).
        kv_cache_bytes: KV cache bytes per worker.
        tensor_parallel_size: workers each stage's layers are split over.
        pipeline_parallel_size: stages the layers are split into.
        block_size: tokens per block.
        kv_cache_dtype: the cache dtype (``"auto"``: the model's dtype).
        max_model_len: the longest sequence in tokens (None or -1: fitted).
        gpu_memory_utilization: fraction of the GPU's memory vLLM may use.
        max_num_seqs: requests running at once, for the activation reserve (None: vLLM's default).
        max_num_batched_tokens: tokens per step, for the activation reserve (None: vLLM's default).
    """
    from pagedkv.deployment import VLLMFlags
    from pagedkv.models import describe_model, engine_config_for

    if sum(x is not None for x in (gpu, num_blocks, kv_cache_bytes)) != 1:
        raise ConfigError("give exactly one of gpu, num_blocks and kv_cache_bytes")
    if num_blocks is not None and (not isinstance(num_blocks, int) or num_blocks < 2):
        raise ConfigError(f"num_blocks must be an integer >= 2, got {num_blocks!r}")
    if num_blocks is None:
        flags = VLLMFlags(
            max_model_len=max_model_len,
            block_size=block_size,
            kv_cache_dtype=kv_cache_dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        request = PlanRequest(
            model=model,
            gpu=gpu,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            flags=flags,
        )
        return setup_from_request(request)[0]
    fixed = max_model_len not in (None, -1)
    layout = describe_model(model)
    options: dict[str, Any] = {
        "block_size": block_size,
        "cache_dtype": kv_cache_dtype,
        "tensor_parallel_size": tensor_parallel_size,
        "pipeline_parallel_size": pipeline_parallel_size,
        "gpu_memory_utilization": gpu_memory_utilization,
    }
    if max_model_len is not None:
        options["max_model_len"] = max_model_len
    config = engine_config_for(layout, **options)
    inputs = plan_inputs_for(layout, config, fixed_max_model_len=fixed)
    plan, planned_config = plan_with_num_blocks(inputs, num_blocks)
    return setup_from_plan(plan, planned_config, layout.name, inputs)
