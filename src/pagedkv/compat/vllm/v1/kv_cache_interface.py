"""vLLM's ``vllm.v1.kv_cache_interface``: pagedkv's spec classes under vLLM's names, and
vLLM's group/config shapes (positional groups, roles, retention) over pagedkv's types."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from enum import IntEnum, StrEnum
from typing import Any

from pagedkv import specs as _specs
from pagedkv.compat.vllm._outside import outside_class
from pagedkv.compat.vllm.v1 import _spec_fields as _f
from pagedkv.compat.vllm.v1._spec_fields import vllm_spec_class
from pagedkv.compat.vllm.v1.kv_cache_layout import KVCacheLayout
from pagedkv.errors import RegistryError
from pagedkv.planning import types as _types
from pagedkv.specs import KVCacheSpec as _CoreKVCacheSpec

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "HiddenStateCacheSpec",
    "KVCacheConfig",
    "KVCacheGroupRole",
    "KVCacheGroupSpec",
    "KVCacheLayout",
    "KVCacheSpec",
    "KVCacheSpecKind",
    "KVCacheTensor",
    "KVQuantMode",
    "MLAAttentionSpec",
    "MambaSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "SparseCacheRole",
    "UniformTypeKVCacheSpecs",
    "get_kv_cache_spec_kind",
    "get_kv_cache_spec_sliding_window",
    "get_mamba_prefill_checkpoint_position",
    "is_full_attention_spec",
    "iter_layer_specs",
]

_MODULE = __name__


@dataclasses.dataclass(frozen=True, kw_only=True)
class KVCacheSpec(_CoreKVCacheSpec):
    """vLLM's base spec: constructible (its sizes raise until a subclass defines them),
    and every pagedkv spec is one (``isinstance`` answers for pagedkv's base)."""

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} defines no page size")

    def max_memory_usage_bytes(self, config: Any) -> int:
        raise NotImplementedError(f"{type(self).__name__} defines no memory usage")

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        if cls is KVCacheSpec and issubclass(subclass, _CoreKVCacheSpec):
            return True
        return NotImplemented


def _core_spec(name: str) -> type:
    """pagedkv's spec class ``name``; a placeholder naming it while this build lacks it."""
    found = getattr(_specs, name, None)
    if isinstance(found, type):
        return found
    return outside_class(name, f"{name} (a spec kind this pagedkv build does not have)", _MODULE)


_ATTN = {**_f.BASE_FIELDS, **_f.ATTENTION_FIELDS}
_FULL = {**_ATTN, **_f.FULL_FIELDS}

AttentionSpec = _specs.AttentionSpec
FullAttentionSpec = vllm_spec_class("FullAttentionSpec", (_specs.FullAttentionSpec,), _FULL)
MLAAttentionSpec = vllm_spec_class(
    "MLAAttentionSpec",
    (FullAttentionSpec, _specs.MLAAttentionSpec),
    _f.MLA_FIELDS,
    {"head_size_v": 0},
)
SinkFullAttentionSpec = vllm_spec_class(
    "SinkFullAttentionSpec", (FullAttentionSpec, _specs.SinkFullAttentionSpec), {}
)
SlidingWindowSpec = vllm_spec_class("SlidingWindowSpec", (_specs.SlidingWindowSpec,), _ATTN)
SlidingWindowMLASpec = vllm_spec_class(
    "SlidingWindowMLASpec",
    (SlidingWindowSpec, _specs.SlidingWindowMLASpec),
    _f.SWA_MLA_FIELDS,
    {"head_size_v": 0},
)
ChunkedLocalAttentionSpec = vllm_spec_class(
    "ChunkedLocalAttentionSpec", (_specs.ChunkedLocalAttentionSpec,), _ATTN
)
CrossAttentionSpec = vllm_spec_class("CrossAttentionSpec", (_specs.CrossAttentionSpec,), _ATTN)
EncoderOnlyAttentionSpec = vllm_spec_class(
    "EncoderOnlyAttentionSpec", (_specs.EncoderOnlyAttentionSpec,), _ATTN
)
MambaSpec = vllm_spec_class("MambaSpec", (_specs.MambaSpec,), {**_f.BASE_FIELDS, **_f.MAMBA_FIELDS})


def _core_kind(name: str, bases: tuple[type, ...], extra: dict[str, Any]) -> type:
    core = getattr(_specs, name, None)
    if not isinstance(core, type):
        return _core_spec(name)
    return vllm_spec_class(name, (*bases, core), extra)


CircularBufferSpec = _core_kind("CircularBufferSpec", (), _ATTN)
RSWASpec = _core_kind("RSWASpec", (FullAttentionSpec,), {})
HiddenStateCacheSpec = _core_kind("HiddenStateCacheSpec", (MLAAttentionSpec,), {})
HiSparseHotSpec = _core_kind("HiSparseHotSpec", (), _f.BASE_FIELDS)
HiSparseResidentSpec = _core_kind("HiSparseResidentSpec", (), _f.BASE_FIELDS)


class KVQuantMode(IntEnum):
    """vLLM's KV cache quantization modes (attention-backend dispatch, not sizing)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
    TURBOQUANT_K8V4 = 6
    TURBOQUANT_4BIT_NC = 7


class KVCacheSpecKind(StrEnum):
    """A spec's kind as KV events report it; the values are pagedkv's ``spec.kind``."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


class SparseCacheRole(StrEnum):
    SPARSE = "sparse"
    INDEXER = "indexer"


class KVCacheGroupRole(StrEnum):
    """A group's role; equal to pagedkv's role strings (``"default"``...)."""

    DEFAULT = "default"
    HISPARSE_SOURCE = "hisparse_source"
    HISPARSE_INDEXER = "hisparse_indexer"


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class UniformTypeKVCacheSpecs(_specs.UniformTypeKVCacheSpecs):
    """pagedkv's uniform-type group spec; a spec type nobody registered fails the check
    with vLLM's ``AssertionError``."""

    def __post_init__(self) -> None:
        if self.kv_cache_specs:
            super().__post_init__()
            return
        # vLLM builds empty wrappers too (projecting groups onto a worker): no layers
        object.__setattr__(self, "kv_cache_specs", {})
        _specs.KVCacheSpec.__post_init__(self)

    @property
    def dcp_sharded(self) -> bool:
        """Whether the layers' blocks are sharded over DCP ranks (the first layer's)."""
        specs = self.kv_cache_specs
        return bool(specs) and bool(getattr(self.first_spec, "dcp_sharded", False))

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: Any) -> bool:
        try:
            return super().is_uniform_type(kv_cache_specs)
        except RegistryError as exc:
            raise AssertionError(f"Unsupported KV cache spec type: {exc}") from exc


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class KVCacheTensor(_types.KVCacheTensor):
    """pagedkv's tensor built as vLLM builds it (positional, no page size: vLLM reads
    pages off the layers' specs, so the page does not take part in equality)."""

    page_size_bytes: int = dataclasses.field(default=0, compare=False)

    def __init__(
        self,
        size: int,
        layers: Sequence[str],
        layer_stride: int,
        block_stride: int,
        offset: int = 0,
        host_resident: bool = False,
        page_size_bytes: int = 0,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "size", size)
        set_(self, "layers", LayerNames(layers))
        set_(self, "layer_stride", layer_stride)
        set_(self, "block_stride", block_stride)
        set_(self, "offset", offset)
        set_(self, "host_resident", host_resident)
        set_(self, "page_size_bytes", page_size_bytes)
        self.__post_init__()
        set_(self, "layers", LayerNames(self.layers))

    @classmethod
    def from_core(cls, tensor: _types.KVCacheTensor) -> KVCacheTensor:
        """pagedkv's placed tensor as vLLM's."""
        return cls(
            tensor.size,
            tensor.layers,
            tensor.layer_stride,
            tensor.block_stride,
            tensor.offset,
            tensor.host_resident,
            tensor.page_size_bytes,
        )


class LayerNames(tuple[str, ...]):
    """A group's layer names: a tuple (groups stay hashable) equal to the list vLLM
    keeps them in."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return tuple.__eq__(self, tuple(other) if isinstance(other, list) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class KVCacheGroupSpec(_types.KVCacheGroupSpec):
    """pagedkv's group, built as vLLM builds it: ``KVCacheGroupSpec(names, spec)``."""

    is_eagle_group: bool = False
    enable_kv_transfer: bool = True

    def __init__(
        self,
        layer_names: Sequence[str],
        kv_cache_spec: _CoreKVCacheSpec,
        is_eagle_group: bool = False,
        host_resident: bool = False,
        enable_kv_transfer: bool = True,
        role: str = KVCacheGroupRole.DEFAULT,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "layer_names", LayerNames(layer_names))
        set_(self, "kv_cache_spec", kv_cache_spec)
        set_(self, "is_eagle_group", is_eagle_group)
        set_(self, "host_resident", host_resident)
        set_(self, "enable_kv_transfer", enable_kv_transfer)
        set_(self, "role", KVCacheGroupRole(role) if role in _ROLES else role)
        self.__post_init__()
        set_(self, "layer_names", LayerNames(self.layer_names))


_ROLES = {r.value for r in KVCacheGroupRole}


def _set_group_field(self: KVCacheGroupSpec, name: str, value: Any) -> None:
    object.__setattr__(self, name, LayerNames(value) if name == "layer_names" else value)


# vLLM's groups and configs are mutable dataclasses (callers rebind their fields).
KVCacheGroupSpec.__setattr__ = _set_group_field  # type: ignore[method-assign,assignment]


@dataclasses.dataclass(frozen=True, kw_only=True)
class KVCacheConfig(_types.KVCacheConfig):
    """pagedkv's per-worker config with vLLM's extra fields (retention, hash geometry)."""

    kv_cache_layout: Any = "NHD"
    # vLLM's dataclass default: dense retention (the engine copies CacheConfig's 0 in).
    prefix_cache_retention_interval: int | None = None
    hash_block_size: int | None = None
    cache_hit_alignment_tokens: int | None = None
    hisparse_host_num_blocks: int | None = None
    hisparse_host_block_stride: int | None = None
    hisparse_shared_host_pool: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        # vLLM's groups are a list its callers edit in place
        object.__setattr__(self, "kv_cache_groups", list(self.kv_cache_groups))

    @property
    def transfer_group_ids(self) -> tuple[int, ...]:
        return tuple(
            i for i, g in enumerate(self.kv_cache_groups) if getattr(g, "enable_kv_transfer", True)
        )

    @property
    def transfer_groups(self) -> tuple[Any, ...]:
        """The groups a KV connector transfers (``transfer_group_ids``)."""
        return tuple(self.kv_cache_groups[i] for i in self.transfer_group_ids)

    @property
    def transfer_group_index_by_layer(self) -> dict[str, int]:
        """Each transferred layer's position in ``transfer_groups``."""
        return {
            name: index
            for index, group in enumerate(self.transfer_groups)
            for name in group.layer_names
        }

    def select_transfer_block_ids(self, block_ids: Sequence[list[int]]) -> tuple[list[int], ...]:
        """The block id lists of the transferred groups, from one list per group."""
        if len(block_ids) != len(self.kv_cache_groups):
            raise ValueError(
                f"Expected {len(self.kv_cache_groups)} KV cache groups, got {len(block_ids)}."
            )
        return tuple(block_ids[i] for i in self.transfer_group_ids)

    @property
    def prefix_cacheable_group_ids(self) -> tuple[int, ...]:
        """Transferred groups whose blocks a hash-addressed store may keep."""
        return tuple(
            i
            for i in self.transfer_group_ids
            if self.kv_cache_groups[i].kv_cache_spec.prefix_cacheable
        )

    @property
    def prefix_cacheable_groups(self) -> tuple[Any, ...]:
        return tuple(self.kv_cache_groups[i] for i in self.prefix_cacheable_group_ids)

    @property
    def has_mamba_layers(self) -> bool:
        return any(
            isinstance(spec, _specs.MambaSpec)
            for group in self.kv_cache_groups
            for spec in iter_layer_specs(group.kv_cache_spec)
        )

    @property
    def has_mixed_precision_kv_cache(self) -> bool:
        """Whether the device's attention layers use more than one precision."""
        precisions = {
            (str(spec.dtype), int(getattr(spec, "kv_quant_mode", 0)))
            for group in self.kv_cache_groups
            if not getattr(group, "host_resident", False)
            for spec in iter_layer_specs(group.kv_cache_spec)
            if isinstance(spec, _specs.AttentionSpec)
        }
        return len(precisions) > 1

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        """Whether new blocks must be zeroed before use: Mamba state is read before it is
        fully written, and a block reused under another precision decodes stale bytes."""
        return self.has_mamba_layers or self.has_mixed_precision_kv_cache


KVCacheConfig.__setattr__ = object.__setattr__  # type: ignore[method-assign]

# vLLM's KVCacheConfig takes its leading fields by position too.
_CONFIG_POSITIONAL = (
    "num_blocks",
    "kv_cache_tensors",
    "kv_cache_groups",
    "prefix_cache_retention_interval",
    "kv_cache_layout",
)
_config_keyword_init = KVCacheConfig.__init__


def _config_init(self: KVCacheConfig, *args: Any, **kwargs: Any) -> None:
    if len(args) > len(_CONFIG_POSITIONAL):
        raise TypeError(f"KVCacheConfig takes at most {len(_CONFIG_POSITIONAL)} positional fields")
    for name, value in zip(_CONFIG_POSITIONAL, args):
        if name in kwargs:
            raise TypeError(f"KVCacheConfig got {name!r} twice")
        kwargs[name] = value
    _config_keyword_init(self, **kwargs)


KVCacheConfig.__init__ = _config_init  # type: ignore[method-assign]


def iter_layer_specs(kv_cache_spec: _CoreKVCacheSpec) -> Collection[_CoreKVCacheSpec]:
    if isinstance(kv_cache_spec, _specs.UniformTypeKVCacheSpecs):
        return kv_cache_spec.kv_cache_specs.values()
    return (kv_cache_spec,)


def is_full_attention_spec(kv_cache_spec: _CoreKVCacheSpec) -> bool:
    layers = iter_layer_specs(kv_cache_spec)
    return len(layers) > 0 and all(isinstance(s, FullAttentionSpec) for s in layers)


def _kind_of(spec: _CoreKVCacheSpec) -> KVCacheSpecKind:
    try:
        return KVCacheSpecKind(spec.kind)
    except ValueError:
        return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_kind(kv_cache_spec: _CoreKVCacheSpec) -> KVCacheSpecKind:
    """pagedkv's ``spec.kind`` as vLLM's enum; a uniform-type group of several kinds is
    full attention when all its layers group under full attention."""
    if not isinstance(kv_cache_spec, _specs.UniformTypeKVCacheSpecs):
        return _kind_of(kv_cache_spec)
    layers = kv_cache_spec.kv_cache_specs.values()
    kinds = {get_kv_cache_spec_kind(s) for s in layers}
    if len(kinds) == 1:
        return kinds.pop()
    from pagedkv.compat.vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    bases = {KVCacheSpecRegistry.get_uniform_type_base_spec(s) for s in layers}
    if bases == {FullAttentionSpec}:
        return KVCacheSpecKind.FULL_ATTENTION
    return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_sliding_window(kv_cache_spec: _CoreKVCacheSpec) -> int | None:
    if isinstance(kv_cache_spec, _specs.UniformTypeKVCacheSpecs):
        windows = {get_kv_cache_spec_sliding_window(s) for s in iter_layer_specs(kv_cache_spec)}
        return windows.pop() if len(windows) == 1 else None
    if isinstance(kv_cache_spec, _specs.SlidingWindowSpec):
        return kv_cache_spec.sliding_window
    return None


def get_mamba_prefill_checkpoint_position(
    num_tokens: int,
    hash_block_size: int,
    drop_eagle_block: bool,
    num_hash_lookahead_tokens: int = 0,
) -> int:
    """The prefill checkpoint boundary, from pagedkv's Mamba spec module when it has one."""
    core = getattr(_specs.mamba, "prefill_checkpoint_position", None)
    if core is None:
        raise NotImplementedError("Mamba prefill checkpoints need pagedkv's checkpoint support")
    return int(core(num_tokens, hash_block_size, drop_eagle_block, num_hash_lookahead_tokens))
