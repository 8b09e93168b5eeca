"""Sizing: workers' specs and groups, memory to blocks, the max_model_len check and
auto-fit."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from pagedkv.config import EngineConfig
from pagedkv.errors import InsufficientMemoryError, PlanningError
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import AttentionSpec, KVCacheSpec
from pagedkv.specs.full import MLAAttentionSpec
from pagedkv.specs.local import SlidingWindowMLASpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "GiB",
    "gib",
    "merge_worker_specs",
    "project_groups",
    "kv_tp_replicas",
    "RequestCost",
    "blocks_from_memory",
    "fit_max_model_len",
]

GiB = 1 << 30


def gib(num_bytes: int) -> str:
    return f"{num_bytes / GiB:.2f} GiB"


def merge_worker_specs(
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
) -> dict[str, KVCacheSpec]:
    """All workers' layers by name; one name with different specs is an error."""
    merged: dict[str, KVCacheSpec] = {}
    owner: dict[str, int] = {}
    for worker, specs in enumerate(kv_cache_specs_per_worker):
        for name, spec in specs.items():
            seen = merged.setdefault(name, spec)
            owner.setdefault(name, worker)
            if seen is not spec and seen != spec:
                raise PlanningError(
                    f"layer {name!r} has different KV cache specs on worker {owner[name]} "
                    f"({seen!r}) and worker {worker} ({spec!r})"
                )
    return merged


def project_groups(
    groups: Sequence[KVCacheGroupSpec], worker_layers: Collection[str]
) -> list[KVCacheGroupSpec]:
    """The global groups restricted to one worker's layers; every worker keeps every
    group (maybe empty) so group ids agree across pipeline stages."""
    out = []
    for group in groups:
        names = tuple(n for n in group.layer_names if n in worker_layers)
        if len(names) == len(group.layer_names):
            out.append(group)
            continue
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs) and names:
            specs = {n: spec.kv_cache_specs[n] for n in names}
            spec = dataclasses.replace(spec, kv_cache_specs=specs)  # keeps the spec's class
        out.append(dataclasses.replace(group, layer_names=names, kv_cache_spec=spec))
    return out


def _layer_replicas(spec: KVCacheSpec, tp: int) -> int:
    if not isinstance(spec, AttentionSpec):
        return 1
    shards = spec.max_tp_shards
    if shards is None and isinstance(spec, MLAAttentionSpec | SlidingWindowMLASpec):
        shards = 1  # one latent per token: every rank holds all of it
    return 1 if shards is None else max(1, tp // shards)


def kv_tp_replicas(groups: Sequence[KVCacheGroupSpec], tensor_parallel_size: int) -> int:
    """How many TP ranks hold identical KV (gcd of tp and every layer's replica count)."""
    values = {
        _layer_replicas(spec, tensor_parallel_size)
        for group in groups
        for spec in group.layer_specs().values()
    }
    return math.gcd(tensor_parallel_size, *values) if values else 1


class RequestCost:
    """Blocks one request of a given length holds at most, summed over device groups."""

    def __init__(self, groups: Sequence[KVCacheGroupSpec], config: EngineConfig) -> None:
        counts: Counter[KVCacheSpec] = Counter(
            g.kv_cache_spec for g in groups if not g.host_resident and g.layer_names
        )
        self._items = list(counts.items())
        self._config = config
        self._cache: dict[int, int] = {}

    @property
    def empty(self) -> bool:
        return not self._items

    def config_at(self, max_model_len: int) -> EngineConfig:
        if self._config.max_model_len == max_model_len:
            return self._config
        return self._config.replace(max_model_len=max_model_len)

    def blocks(self, max_model_len: int) -> int:
        cached = self._cache.get(max_model_len)
        if cached is None:
            config = self.config_at(max_model_len)
            cached = sum(n * s.max_memory_usage_blocks(config) for s, n in self._items)
            self._cache[max_model_len] = cached
        return cached

    def largest_fitting(self, free_blocks: int, upper: int) -> int:
        """Largest length in ``[1, upper]`` whose request fits in ``free_blocks``; 0 if none
        (``upper`` itself when no device group holds tokens)."""
        if self.empty:
            return upper
        if upper < 1 or self.blocks(1) > free_blocks:
            return 0
        lo, hi = 1, upper
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.blocks(mid) <= free_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo


def blocks_from_memory(
    config: EngineConfig, bytes_per_block: Sequence[int], available: Sequence[int]
) -> int:
    """Blocks every worker can hold (null block included); the override when set."""
    active = [w for w, bpb in enumerate(bytes_per_block) if bpb > 0]
    if not active:
        return 1
    for w in active:
        if available[w] <= 0:
            raise InsufficientMemoryError(
                f"worker {w} has no memory available for KV cache blocks ({available[w]} bytes); "
                "raise CacheConfig.gpu_memory_utilization or kv_cache_memory_bytes"
            )
    override = config.cache.num_gpu_blocks_override
    if override is not None:
        for w in active:
            need = override * bytes_per_block[w]
            if need > available[w]:
                raise InsufficientMemoryError(
                    f"CacheConfig.num_gpu_blocks_override={override} needs {need} bytes "
                    f"({gib(need)}) on worker {w}, but only {available[w]} bytes "
                    f"({gib(available[w])}) are available"
                )
        return override
    w = min(active, key=lambda w: available[w] // bytes_per_block[w])
    num_blocks = available[w] // bytes_per_block[w]
    if num_blocks < 1:
        raise InsufficientMemoryError(
            f"worker {w} has {available[w]} bytes, less than one KV cache block "
            f"({bytes_per_block[w]} bytes)"
        )
    return num_blocks


def fit_max_model_len(
    config: EngineConfig,
    cost: RequestCost,
    num_blocks: int,
    bytes_per_block: Sequence[int],
    available: Sequence[int],
    limit: int,
) -> tuple[int, bool]:
    """(planned max_model_len, whether it was auto-fitted). One block is the null block.

    Args:
        config: the engine config; its ``max_model_len`` (-1: fit) is checked or fitted.
        cost: blocks one request holds at a given length, summed over device groups.
        num_blocks: KV cache blocks per worker, the null block included.
        bytes_per_block: bytes of one block on each worker.
        available: bytes available on each worker, for the error message.
        limit: the most tokens an auto-fitted length may take.
    """
    free = num_blocks - 1
    if config.max_model_len == -1:
        length = cost.largest_fitting(free, limit)
        if length <= 0:
            raise InsufficientMemoryError(
                f"cannot auto-fit max_model_len: {free} usable KV cache blocks cannot hold "
                f"one token ({cost.blocks(1)} blocks needed); raise "
                "CacheConfig.gpu_memory_utilization"
            )
        return length, True
    length = config.max_model_len
    need = cost.blocks(length)
    if need <= free:
        return length, False
    w = max(range(len(bytes_per_block)), key=lambda w: bytes_per_block[w] * need - available[w])
    needed_bytes = (need + 1) * bytes_per_block[w]
    largest = cost.largest_fitting(free, length - 1)
    hint = (
        f"the largest max_model_len that fits is {largest}"
        if largest > 0
        else "not even a one-token request fits"
    )
    override = config.cache.num_gpu_blocks_override
    have = (
        f"CacheConfig.num_gpu_blocks_override={override} allows {num_blocks} blocks"
        if override is not None
        else f"only {available[w]} bytes ({gib(available[w])}) are available there "
        f"({num_blocks} blocks)"
    )
    raise InsufficientMemoryError(
        f"one request of max_model_len={length} tokens needs {need} KV cache blocks plus the "
        f"null block ({needed_bytes} bytes, {gib(needed_bytes)} on worker {w}), but {have}; "
        f"{hint}. Lower ModelConfig.max_model_len (or set it to -1 to fit automatically) "
        "or give the KV cache more memory"
    )
