"""Planning results, all frozen: per-worker configs (what the runtime reads), their
groups and the tensors backing them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pagedkv.errors import PlanningError
from pagedkv.specs.base import KVCacheSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "DEFAULT_ROLE",
    "LayerRegion",
    "KVCacheTensor",
    "KVCacheGroupSpec",
    "KVCacheConfig",
]

DEFAULT_ROLE = "default"


class LayerRegion(NamedTuple):
    """One layer's page for block ``b``: ``page_size_bytes`` bytes at ``offset + b *
    block_stride`` of the backing allocation."""

    layer_name: str
    offset: int
    block_stride: int
    page_size_bytes: int
    host_resident: bool = False

    def block_range(self, block_id: int) -> tuple[int, int]:
        start = self.offset + block_id * self.block_stride
        return start, start + self.page_size_bytes


@dataclass(frozen=True, kw_only=True)
class KVCacheTensor:
    """A view into one backing allocation of ``size`` bytes: layer ``layers[i]``'s page
    for block ``b`` starts at ``offset + i * layer_stride + b * block_stride``."""

    size: int
    layers: tuple[str, ...]
    layer_stride: int
    block_stride: int
    page_size_bytes: int
    offset: int = 0
    host_resident: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if self.size < 0:
            raise PlanningError(f"KVCacheTensor.size must be >= 0, got {self.size}")

    def regions(self) -> list[LayerRegion]:
        rest = (self.block_stride, self.page_size_bytes, self.host_resident)
        return [
            LayerRegion(name, self.offset + i * self.layer_stride, *rest)
            for i, name in enumerate(self.layers)
        ]


@dataclass(frozen=True, kw_only=True)
class KVCacheGroupSpec:
    """Layers sharing one block table, with the group's (merged) spec and role.
    ``is_eagle_group``: it holds an EAGLE/MTP draft model's layers (speculative decoding)."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    role: str = DEFAULT_ROLE
    host_resident: bool = False
    is_eagle_group: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_names", tuple(self.layer_names))

    def layer_specs(self) -> dict[str, KVCacheSpec]:
        """Each layer's own spec (a uniform-type group knows them; else the group spec)."""
        spec = self.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            return {name: spec.kv_cache_specs[name] for name in self.layer_names}
        return dict.fromkeys(self.layer_names, spec)


@dataclass(frozen=True, kw_only=True)
class KVCacheConfig:
    """One worker's KV cache: block count, backing tensors and groups."""

    num_blocks: int
    kv_cache_tensors: tuple[KVCacheTensor, ...]
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    kv_cache_layout: str = "NHD"
    max_model_len: int | None = None
    kv_tp_replicas: int = 1
    # (layer, target): the layer reads the target layer's cache and has none of its own.
    shared_kv_cache_layers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_tensors", tuple(self.kv_cache_tensors))
        object.__setattr__(self, "kv_cache_groups", tuple(self.kv_cache_groups))
        shared = self.shared_kv_cache_layers
        pairs = shared.items() if isinstance(shared, Mapping) else shared
        object.__setattr__(self, "shared_kv_cache_layers", tuple((a, b) for a, b in pairs))
        if self.num_blocks < 1:
            raise PlanningError(f"KVCacheConfig.num_blocks must be >= 1, got {self.num_blocks}")

    @property
    def device_tensors(self) -> tuple[KVCacheTensor, ...]:
        return tuple(t for t in self.kv_cache_tensors if not t.host_resident)

    @property
    def host_tensors(self) -> tuple[KVCacheTensor, ...]:
        return tuple(t for t in self.kv_cache_tensors if t.host_resident)

    @property
    def device_bytes(self) -> int:
        """Size of the one device backing allocation (0 with no tensors)."""
        return max((t.size for t in self.device_tensors), default=0)

    @property
    def layer_names(self) -> list[str]:
        return [name for group in self.kv_cache_groups for name in group.layer_names]

    def group_layer_names(self, group_id: int) -> tuple[str, ...]:
        """The layers that read group ``group_id``'s blocks: its own, then the layers
        sharing one of their caches (vLLM appends those to the group's layer names)."""
        own = self.kv_cache_groups[group_id].layer_names
        members = set(own)
        return own + tuple(a for a, b in self.shared_kv_cache_layers if b in members)

    def layer_regions(self) -> dict[str, LayerRegion]:
        """Every layer's byte region, by layer name."""
        return {r.layer_name: r for t in self.kv_cache_tensors for r in t.regions()}
