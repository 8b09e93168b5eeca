"""vLLM's ``vllm.v1.core.kv_cache_planning``: its planning entry points over vLLM
configs, answered by pagedkv's grouping, page unification, placement and sizing
(``pagedkv.planning``). vLLM's flow (project the global groups onto each worker,
apply the block override, keep the null block back, auto-fit or check the model
length, place each worker, converge on the smallest block count) is kept; every
number in it comes from pagedkv."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pagedkv.compat.vllm._outside import outside_function
from pagedkv.compat.vllm.config._engine_config import layout_name
from pagedkv.compat.vllm.v1 import kv_cache_interface as _iface
from pagedkv.compat.vllm.v1.core._groups import engine_config_of as _engine_config_of
from pagedkv.compat.vllm.v1.core._groups import get_kv_cache_groups
from pagedkv.compat.vllm.v1.core._groups import vllm_group as _vllm_group
from pagedkv.compat.vllm.v1.core.kv_cache_config_builder import (
    KVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning import grouping as _grouping
from pagedkv.planning import pages as _pages
from pagedkv.planning import placement as _placement
from pagedkv.planning import sizing as _sizing
from pagedkv.planning.layout import check_layout_expresses, is_block_outermost
from pagedkv.planning.packing import approximate_gcd, packed_kv_cache_groups
from pagedkv.planning.types import KVCacheGroupSpec as _CoreGroup
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import AttentionSpec, KVCacheSpec, MambaSpec

__all__ = [
    "DefaultKVCacheConfigBuilder",
    "check_enough_kv_cache_memory",
    "estimate_max_model_len",
    "get_global_kv_cache_groups",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_configs",
    "get_kv_cache_groups",
    "get_kv_cache_groups_from_builder",
    "is_kv_cache_spec_uniform",
    "kv_cache_groups_tp_replicas",
    "unify_hybrid_kv_cache_specs",
    "unify_kv_cache_spec_page_size",
]

logger = logging.getLogger("vllm.v1.core.kv_cache_planning")


# --- configs and groups -------------------------------------------------------------


def _layout(vllm_config: Any) -> Any:
    """vLLM's resolved ``KVCacheLayout`` (ValueError while unresolved)."""
    cache = vllm_config.cache_config
    resolve = getattr(cache, "get_resolved_kv_cache_layout", None)
    if callable(resolve):
        resolved = layout_name(resolve())
        if resolved is not None and resolved in _iface.KVCacheLayout.__members__:
            return _iface.KVCacheLayout[resolved]
    name = layout_name(getattr(cache, "kv_cache_layout", None))
    if name is None:
        raise ValueError("KV cache layout has not been resolved yet")
    return _iface.KVCacheLayout[name]


def _retention(vllm_config: Any) -> int | None:
    value = getattr(vllm_config.cache_config, "prefix_cache_retention_interval", None)
    return value if value is None or type(value) is int else None


def is_kv_cache_spec_uniform(kv_cache_spec: Mapping[str, KVCacheSpec]) -> bool:
    """Whether every layer's spec merges into one (one group, no uniform-type wrapper)."""
    if not kv_cache_spec:
        return True
    return _grouping.try_merge(list(kv_cache_spec.values())) is not None


def _check_exact_partition(groups: Sequence[Any], kv_cache_spec: Mapping[str, Any]) -> None:
    seen: set[str] = set()
    for group in groups:
        names = set(group.layer_names)
        assert not names & seen, f"KV cache group overlaps: {sorted(names & seen)}."
        seen |= names
    missing = set(kv_cache_spec) - seen
    assert not missing, f"KV cache groups miss layers: {sorted(missing)}."


def get_kv_cache_groups_from_builder(
    builder: KVCacheConfigBuilder, vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec]
) -> list[Any]:
    """The builder's groups, checked to hold every layer exactly once."""
    groups = list(builder.get_kv_cache_groups(vllm_config, kv_cache_spec))
    _check_exact_partition(groups, kv_cache_spec)
    return groups


def _merge_worker_specs(specs_per_worker: Sequence[Mapping[str, KVCacheSpec]]) -> dict[str, Any]:
    try:
        return _sizing.merge_worker_specs(specs_per_worker)
    except PlanningError as exc:
        raise AssertionError(str(exc)) from exc


def get_global_kv_cache_groups(
    vllm_config: Any, kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]]
) -> list[Any]:
    """The groups of the whole model (every worker's layers)."""
    builder = get_kv_cache_config_builder(vllm_config)
    merged = _merge_worker_specs(kv_cache_specs)
    KVCacheSpecRegistry.check_kv_cache_spec_registry(merged)
    lookahead = getattr(vllm_config, "num_prefill_lookahead_tokens", 0)
    merged = _grouping.with_retained_tokens(merged, lookahead if type(lookahead) is int else 0)
    groups = get_kv_cache_groups_from_builder(builder, vllm_config, merged)
    spec_config = getattr(vllm_config, "speculative_config", None)
    if spec_config is not None and spec_config.use_eagle_block_drop():
        drafts = {name for name, spec in merged.items() if spec.is_draft}
        for group in groups:
            group.is_eagle_group = not drafts.isdisjoint(group.layer_names)
        _warn_if_no_draft_group(spec_config, groups)
    return groups


def _warn_if_no_draft_group(spec_config: Any, groups: Sequence[Any]) -> None:
    if any(g.is_eagle_group for g in groups):
        return
    if any(
        isinstance(s, MambaSpec) for g in groups for s in _iface.iter_layer_specs(g.kv_cache_spec)
    ):
        logger.warning(
            "Speculative decoding (method=%s) is on but no KV cache group could be "
            "identified as the draft model's.",
            getattr(spec_config, "method", None),
        )


def _project_kv_cache_groups_to_worker(
    global_kv_cache_groups: Sequence[Any], worker_spec: Mapping[str, KVCacheSpec]
) -> list[_iface.KVCacheGroupSpec]:
    """The global groups restricted to one worker's layers (pagedkv's projection)."""
    projected = _sizing.project_groups(
        [_core_view(g) for g in global_kv_cache_groups], worker_spec.keys()
    )
    out = []
    for original, group in zip(global_kv_cache_groups, projected, strict=True):
        if len(group.layer_names) == len(original.layer_names):
            out.append(original)
            continue
        out.append(
            _iface.KVCacheGroupSpec(
                group.layer_names,
                group.kv_cache_spec,
                is_eagle_group=original.is_eagle_group,
                host_resident=original.host_resident,
                enable_kv_transfer=getattr(original, "enable_kv_transfer", True),
                role=original.role,
            )
        )
    return out


def _core_view(group: Any) -> _CoreGroup:
    """Any group-shaped object as a pagedkv group."""
    if isinstance(group, _CoreGroup):
        return group
    return _iface.KVCacheGroupSpec(
        list(group.layer_names),
        group.kv_cache_spec,
        is_eagle_group=bool(group.is_eagle_group),
        host_resident=bool(group.host_resident),
        enable_kv_transfer=bool(getattr(group, "enable_kv_transfer", True)),
        role=group.role,
    )


# --- page unification (vLLM's helpers over pagedkv's) ----------------------------


def unify_kv_cache_spec_page_size(kv_cache_spec: Mapping[str, KVCacheSpec]) -> Mapping[str, Any]:
    """Every layer fitted to the largest page by pagedkv's page fitting (a dividing page
    scales its block size, a state or other page is padded, MLA never is); the specs as
    given when the pages agree; NotImplementedError naming a layer that cannot fit."""
    pages = {spec.page_size_bytes for spec in kv_cache_spec.values()}
    if len(pages) <= 1:
        return kv_cache_spec
    largest = max(pages)
    unified: dict[str, Any] = {}
    for name, spec in kv_cache_spec.items():
        fitted = _pages.fit_page(spec, largest, spec.block_size)
        if fitted is None:
            raise NotImplementedError(
                f"Layer {name}: its page ({spec.page_size_bytes} B) does not divide the largest "
                f"page ({largest} B) and cannot be padded (only non-MLA attention pages can)"
            )
        unified[name] = fitted
    return unified


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict[str, KVCacheSpec]) -> None:
    """Hybrid groups disallowed: local layers rewritten in place as full attention
    (pagedkv's promotion); ValueError when they still cannot share one group."""
    if is_kv_cache_spec_uniform(kv_cache_spec):
        return
    try:
        promoted = _grouping.promote_local_specs(kv_cache_spec)
    except PlanningError as exc:
        raise ValueError(str(exc)) from exc
    kv_cache_spec.update(promoted)


# --- bytes per block and placement ------------------------------------------------


def _device_groups(groups: Sequence[Any]) -> list[_CoreGroup]:
    return [_core_view(g) for g in groups if not g.host_resident]


def _get_kv_cache_bytes_per_block(kv_cache_groups: Sequence[Any], layout: Any) -> int:
    """The largest group's bytes per block id under ``layout`` (pagedkv's rule)."""
    name = layout_name(layout) or "LBNHC"
    groups = [_core_view(g) for g in kv_cache_groups]
    return _placement.bytes_per_block(groups, block_outer=is_block_outermost(name))


def _pool_bytes_per_block(vllm_config: Any, kv_cache_groups: Sequence[Any]) -> int:
    """Device bytes one block id costs (host-resident groups excluded)."""
    return _get_kv_cache_bytes_per_block(
        [g for g in kv_cache_groups if not g.host_resident], _layout(vllm_config)
    )


def _pool_bytes_per_block_from_builder(
    builder: KVCacheConfigBuilder, vllm_config: Any, kv_cache_groups: Sequence[Any]
) -> int:
    """Device bytes one block id costs with ``builder``: its declared value, else a
    one-block placement (with any block override suppressed) read back."""
    if not kv_cache_groups:
        return 0
    if getattr(vllm_config.attention_config, "hisparse_config", None) is not None:
        return _pool_bytes_per_block(vllm_config, kv_cache_groups)
    declared = builder._get_pool_bytes_per_block(vllm_config, kv_cache_groups)
    if declared is not None:
        return declared
    cache = vllm_config.cache_config
    saved = cache.num_gpu_blocks_override
    cache.num_gpu_blocks_override = None
    try:
        probe = builder.get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, 1)
    finally:
        cache.num_gpu_blocks_override = saved
    sizes = sorted({t.size for t in probe.kv_cache_tensors if not t.host_resident})
    if len(sizes) != 1:
        raise ValueError(
            f"KV cache tensors must share one device backing allocation, got sizes {sizes}; "
            "override KVCacheConfigBuilder._get_pool_bytes_per_block() for placements "
            "with several device allocations"
        )
    return sizes[0]


def _override(vllm_config: Any) -> int | None:
    value = vllm_config.cache_config.num_gpu_blocks_override
    return value if type(value) is int else None


def get_kv_cache_config_from_groups(
    vllm_config: Any, kv_cache_groups: Sequence[Any], available_memory: int
) -> _iface.KVCacheConfig:
    """The groups placed in ``available_memory`` bytes (or the block override) by
    pagedkv's placement under the resolved layout."""
    if not kv_cache_groups:
        return _iface.KVCacheConfig(
            num_blocks=1,
            kv_cache_tensors=(),
            kv_cache_groups=tuple(kv_cache_groups),
            prefix_cache_retention_interval=_retention(vllm_config),
        )
    if getattr(vllm_config.attention_config, "hisparse_config", None) is not None:
        return _hisparse_config(vllm_config, kv_cache_groups, available_memory)
    layout = _layout(vllm_config)
    groups = [_core_view(g) for g in kv_cache_groups]
    try:
        check_layout_expresses(layout.name, groups)
    except PlanningError as exc:
        raise ValueError(str(exc)) from exc
    bpb = _placement.bytes_per_block(groups, block_outer=layout.is_block_outermost)
    num_blocks = _override(vllm_config) or available_memory // bpb
    config = _engine_config_of(vllm_config, kv_cache_layout=layout.name)
    placed = _placement.place_groups(config, groups, num_blocks)
    return _iface.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tuple(_iface.KVCacheTensor.from_core(t) for t in placed.kv_cache_tensors),
        kv_cache_groups=tuple(kv_cache_groups),
        prefix_cache_retention_interval=_retention(vllm_config),
    )


def _hisparse_config(vllm_config: Any, groups: Sequence[Any], available_memory: int) -> Any:
    from pagedkv.compat.vllm.v1.hisparse import layout as hisparse_layout

    build = getattr(hisparse_layout, "get_hisparse_kv_cache_config", None)
    if build is None:
        build = outside_function(
            "get_hisparse_kv_cache_config", "HiSparse host tier", hisparse_layout.__name__
        )
    return build(vllm_config, groups, available_memory, get_hisparse_host_pool_bytes(vllm_config))


def get_hisparse_host_pool_bytes(vllm_config: Any) -> int:
    """Host bytes HiSparse's pool may take (HiSparse's own module answers)."""
    from pagedkv.compat.vllm.v1.hisparse import runtime as hisparse_runtime

    pool_bytes = getattr(hisparse_runtime, "get_hisparse_host_pool_bytes", None)
    if pool_bytes is None:
        pool_bytes = outside_function(
            "get_hisparse_host_pool_bytes", "HiSparse host tier", __name__
        )
    return int(pool_bytes(vllm_config))


# --- memory checks ----------------------------------------------------------------


def _request_blocks(groups: Sequence[Any], config: EngineConfig) -> int:
    """Blocks one request of ``config.max_model_len`` holds, summed over device groups."""
    return sum(
        g.kv_cache_spec.max_memory_usage_blocks(config) for g in groups if not g.host_resident
    )


def _largest_fitting(groups: Sequence[Any], config: EngineConfig, blocks: int, upper: int) -> int:
    """Largest length in ``[1, upper]`` whose request fits in ``blocks`` (0: none)."""

    def fits(length: int) -> bool:
        return _request_blocks(groups, config.replace(max_model_len=length)) <= blocks

    if upper < 1 or not fits(1):
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _check_enough_memory(
    groups: Sequence[Any], config: EngineConfig, usable_bytes: int, bytes_per_block: int
) -> None:
    """ValueError unless one request of the model's length fits in ``usable_bytes``."""
    if usable_bytes <= 0:
        raise ValueError(
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    need = _request_blocks(groups, config)
    usable = usable_bytes // bytes_per_block
    if need <= usable:
        return
    length = config.max_model_len
    estimate = _largest_fitting(groups, config, usable, length)
    hint = f"the estimated maximum model length is {estimate}. " if estimate > 0 else ""
    raise ValueError(
        f"To serve at least one request with the model's max seq len ({length}), "
        f"{_sizing.gib(need * bytes_per_block)} KV cache is needed ({need} blocks of "
        f"{bytes_per_block} bytes), larger than the available KV cache memory "
        f"({_sizing.gib(usable_bytes)}). Based on the available memory, {hint}"
        "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`."
    )


def estimate_max_model_len(
    vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec], available_memory: int
) -> int:
    """Largest model length whose request fits ``available_memory`` bytes, each layer
    taking its own pages (vLLM's estimate; 0 when one token does not fit)."""
    config = _engine_config_of(vllm_config)
    upper = vllm_config.model_config.max_model_len

    def need_bytes(length: int) -> int:
        at = config.replace(max_model_len=length)
        return sum(s.max_memory_usage_bytes(at) for s in kv_cache_spec.values())

    if upper < 1 or need_bytes(1) > available_memory:
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need_bytes(mid) <= available_memory else (lo, mid - 1)
    return lo


def check_enough_kv_cache_memory(
    vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec], available_memory: int
) -> None:
    """ValueError unless one request of the model's length fits, the null block kept back."""
    if not kv_cache_spec:
        return
    groups = get_kv_cache_groups(vllm_config, dict(kv_cache_spec))
    bpb = _pool_bytes_per_block(vllm_config, groups) if groups else 0
    config = _engine_config_of(vllm_config)
    usable = available_memory - bpb
    if usable <= 0:
        _check_enough_memory(groups, config, usable, max(bpb, 1))
    need = sum(s.max_memory_usage_bytes(config) for s in kv_cache_spec.values())
    if need > usable:
        estimate = estimate_max_model_len(vllm_config, kv_cache_spec, usable)
        hint = f"the estimated maximum model length is {estimate}. " if estimate > 0 else ""
        raise ValueError(
            f"To serve at least one request with the model's max seq len "
            f"({config.max_model_len}), {_sizing.gib(need)} KV cache is needed, larger than "
            f"the available KV cache memory ({_sizing.gib(usable)}). Based on the available "
            f"memory, {hint}Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len`."
        )


def _auto_fit_max_model_len(
    vllm_config: Any,
    groups_per_worker: Sequence[Sequence[Any]],
    usable: Sequence[int],
    bpb: Sequence[int],
) -> None:
    """``max_model_len`` lowered in place to the longest request every worker holds."""
    if all(not groups for groups in groups_per_worker):
        return
    config = _engine_config_of(vllm_config)
    upper = vllm_config.model_config.max_model_len
    fitted = upper
    for groups, free, per_block in zip(groups_per_worker, usable, bpb, strict=True):
        if groups:
            fitted = min(fitted, _largest_fitting(groups, config, free // per_block, upper))
    if fitted <= 0:
        raise ValueError(
            "Cannot auto-fit max_model_len: not enough GPU memory available to serve even "
            "a single token. Try increasing `gpu_memory_utilization`."
        )
    if fitted < upper:
        vllm_config.model_config.max_model_len = fitted


# --- the cross-worker flow ---------------------------------------------------------


def get_kv_cache_configs(
    vllm_config: Any,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
    global_kv_cache_groups: Sequence[Any],
) -> list[Any]:
    """One KV cache config per worker, all with the smallest worker's block count."""
    builder = get_kv_cache_config_builder(vllm_config)
    per_worker = [
        _project_kv_cache_groups_to_worker(global_kv_cache_groups, specs)
        for specs in kv_cache_specs
    ]
    bpb = [
        _pool_bytes_per_block_from_builder(builder, vllm_config, groups) if groups else 0
        for groups in per_worker
    ]
    memory = list(available_memory)
    override = _override(vllm_config)
    if override is not None:
        memory = [override * b if groups else m for groups, b, m in zip(per_worker, bpb, memory)]
    usable = [m - b if groups else m for groups, b, m in zip(per_worker, bpb, memory)]
    if getattr(vllm_config.model_config, "original_max_model_len", None) == -1:
        _auto_fit_max_model_len(vllm_config, per_worker, usable, [max(b, 1) for b in bpb])
    config = _engine_config_of(vllm_config)
    for groups, free, per_block in zip(per_worker, usable, bpb, strict=True):
        if groups:
            _check_enough_memory(groups, config, free, per_block)
    configs = []
    for groups, specs, mem, per_block in zip(per_worker, kv_cache_specs, memory, bpb, strict=True):
        assert sum(len(g.layer_names) for g in groups) == len(specs), (
            "Some layers are not assigned to any group."
        )
        num_blocks = mem // per_block if groups else 1
        configs.append(builder.get_kv_cache_config_from_groups(vllm_config, groups, num_blocks))
    smallest = min(c.num_blocks for c in configs)
    configs = [
        c
        if c.num_blocks == smallest
        else builder.get_kv_cache_config_from_groups(vllm_config, c.kv_cache_groups, smallest)
        for c in configs
    ]
    tp = vllm_config.parallel_config.tensor_parallel_size
    dcp = getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1)
    for c in configs:  # vLLM's configs are mutable
        object.__setattr__(
            c, "kv_tp_replicas", kv_cache_groups_tp_replicas(c.kv_cache_groups, tp, dcp)
        )
    return configs


def kv_cache_groups_tp_replicas(groups: Sequence[Any], tp_size: int, dcp_size: int = 1) -> int:
    """Consecutive TP ranks holding identical KV (pagedkv's ``kv_tp_replicas``). vLLM
    counts a layer without ``max_tp_shards``, or one decode-context-parallel sharded, as
    not replicated, which makes the whole answer 1."""
    for group in groups:
        for spec in _iface.iter_layer_specs(group.kv_cache_spec):
            if not isinstance(spec, AttentionSpec):
                continue
            if spec.max_tp_shards is None or (getattr(spec, "dcp_sharded", False) and dcp_size > 1):
                return 1
    return _sizing.kv_tp_replicas([_core_view(g) for g in groups], tp_size)


# --- the builder ---------------------------------------------------------------------


class DefaultKVCacheConfigBuilder(KVCacheConfigBuilder):
    """vLLM's default builder: the model's own grouping when it declares one, else
    pagedkv's default grouping; pagedkv's placement for ``num_blocks`` blocks."""

    def get_kv_cache_groups(
        self, vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[Any]:
        model = vllm_config.model_config
        if getattr(model, "supports_kv_cache_grouping", False) is not True:
            return get_kv_cache_groups(vllm_config, kv_cache_spec)
        if getattr(vllm_config.attention_config, "hisparse_config", None) is not None:
            raise ValueError(
                "A model-declared get_kv_cache_groups cannot be combined with HiSparse, which "
                "groups its own KV cache layers; remove one of them."
            )
        model_cls, _ = model.registry.resolve_model_cls(model.architectures, model)
        return list(model_cls.get_kv_cache_groups(vllm_config, kv_cache_spec))

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: Sequence[Any], num_blocks: int
    ) -> Any:
        if not kv_cache_groups:
            return get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, 0)
        per_block = _pool_bytes_per_block(vllm_config, kv_cache_groups)
        return get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks * per_block)


def _get_packed_kv_cache_groups(
    vllm_config: Any, kv_cache_spec: Mapping[str, KVCacheSpec]
) -> list[Any] | None:
    """vLLM's packed groups (pagedkv's packing) when the layout is block-outermost and
    the pages differ; None otherwise."""
    layout = _layout(vllm_config)
    pages = {spec.page_size_bytes for spec in kv_cache_spec.values()}
    if not layout.is_block_outermost or len(pages) <= 1:
        return None
    return [_vllm_group(g) for g in packed_kv_cache_groups(kv_cache_spec)]


def _approximate_gcd(values: Sequence[int], *, lower_bound: int | None = None) -> int:
    return approximate_gcd(values, lower_bound or 1)
