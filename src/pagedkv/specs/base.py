"""The base KV cache spec and the attention spec every attention kind builds on."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pagedkv.config import check_fields as _check_fields
from pagedkv.dtypes import canonical_dtype_name, get_kv_dtype
from pagedkv.errors import KVCacheSpecError, RegistryError, UnknownDtypeError
from pagedkv.registry import KVCacheSpecRegistry

__all__ = [
    "cdiv",
    "check_fields",
    "pad_to_alignment",
    "spec_dtype_name",
    "all_match",
    "merge_checked",
    "KVCacheSpec",
    "AttentionSpec",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_fields(spec: object, *names: str, minimum: int = 1, allow_none: bool = False) -> None:
    """KVCacheSpecError naming the class and field of the first bad integer field."""
    _check_fields(spec, *names, minimum=minimum, allow_none=allow_none, error=KVCacheSpecError)


def pad_to_alignment(spec: AttentionSpec, alignment: int | None) -> None:
    """vLLM's page alignment (MLA kinds): a page not a multiple of ``alignment`` bytes is
    padded up to one. Call from ``__post_init__`` once the real page is known."""
    check_fields(spec, "alignment", allow_none=True)
    real = spec.real_page_size_bytes
    if alignment is not None and real % alignment:
        object.__setattr__(spec, "page_size_padded", cdiv(real, alignment) * alignment)


def spec_dtype_name(spec: object, name: str, value: Any) -> str:
    """Canonical dtype name of a spec field, with errors naming the class and field."""
    try:
        return canonical_dtype_name(value)
    except UnknownDtypeError as exc:
        raise UnknownDtypeError(f"{type(spec).__name__}.{name}: {exc}") from None


def all_match(
    kv_cache_specs: Mapping[str, KVCacheSpec], cls: type, reference: object, *names: str
) -> bool:
    """Every spec is a ``cls`` equal to ``reference`` in ``names`` (uniform-type checks)."""
    return all(
        isinstance(s, cls) and all(getattr(s, n) == getattr(reference, n) for n in names)
        for s in kv_cache_specs.values()
    )


def merge_checked(
    cls: type[KVCacheSpec], specs: Sequence[KVCacheSpec], reconciled: Collection[str] = ()
) -> None:
    """KVCacheSpecError unless ``specs`` share one type and agree but in ``reconciled``."""
    if not specs:
        raise KVCacheSpecError(f"{cls.__name__}.merge needs at least one spec")
    first = specs[0]
    for spec in specs:
        if type(spec) is not type(first) or not isinstance(spec, cls):
            raise KVCacheSpecError(
                f"{cls.__name__}.merge: cannot merge {type(first).__name__} with "
                f"{type(spec).__name__} in one KV cache group"
            )
    compared = (f.name for f in dataclasses.fields(first) if f.compare)
    for name in (n for n in compared if n not in reconciled):
        column = [getattr(spec, name) for spec in specs]
        values = [v for i, v in enumerate(column) if v not in column[:i]]
        if len(values) > 1:
            raise KVCacheSpecError(
                f"{cls.__name__}.merge: layers in one KV cache group differ in "
                f"{name!r}: {', '.join(repr(v) for v in values)}"
            )


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec(ABC):
    """How much memory one block of a layer takes and how long blocks live."""

    block_size: int
    # Draft (speculative) layers group with identical target layers.
    is_draft: bool = field(default=False, compare=False)

    kind: ClassVar[str] = "kv_cache"

    def __post_init__(self) -> None:
        check_fields(self, "block_size")

    @property
    @abstractmethod
    def page_size_bytes(self) -> int:
        """Bytes one block of one layer takes, padding included."""

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes one block of one layer holds, padding excluded."""
        return self.page_size_bytes

    @property
    def padding_bytes(self) -> int:
        return self.page_size_bytes - self.real_page_size_bytes

    @property
    def prefix_cacheable(self) -> bool:
        return True

    @property
    def prefix_replay_tokens(self) -> int:
        """Tokens a prefix hit recomputes into this group instead of reusing blocks."""
        return 0

    @property
    def disables_prefix_caching(self) -> bool:
        """Whether a group of this kind turns prefix caching off for the whole model (by
        default when it cannot be cached); kinds that merely stay out of the cache (a
        ring, HiSparse's GPU pages) leave the other groups caching, as in vLLM."""
        return not self.prefix_cacheable

    @property
    def vllm_kind(self) -> str:
        """vLLM's ``KVCacheSpecKind`` value for this spec (KV cache events report it)."""
        return self.kind

    @abstractmethod
    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        """Bytes one request of ``config.max_model_len`` can hold at most, per layer."""

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        """Length of this layer's block-table row for one request."""
        length = config.max_model_len if max_model_len is None else max_model_len
        return cdiv(length, self.block_size)

    def max_memory_usage_blocks(self, config: EngineConfig) -> int:
        return cdiv(self.max_memory_usage_bytes(config), self.page_size_bytes)

    def copy_with_new_block_size(self, block_size: int) -> Self:
        return dataclasses.replace(self, block_size=block_size)

    def block_stride_alignment_bytes(self) -> int:
        """Bytes the stride between this layer's blocks must be a multiple of (1: any);
        the placement pads its page, or the shared block, to it."""
        return 1

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> Self:
        """One spec standing for all ``specs``; they must be equal in every field."""
        merge_checked(cls, specs)
        return specs[0]  # type: ignore[return-value]

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        """Whether every spec of the collection can share one uniform-type group with this one."""
        base = KVCacheSpecRegistry.get_uniform_type_base_spec(self)
        if base is None:
            raise RegistryError(
                f"unsupported KV cache spec type {type(self).__name__}; "
                "register it with @register_kv_cache_spec"
            )
        return all(isinstance(spec, base) for spec in kv_cache_specs.values())


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """Keys and values per token and KV head. Abstract: not registered on its own."""

    num_kv_heads: int
    head_size: int
    dtype: str = "bfloat16"
    head_size_v: int | None = None
    page_size_padded: int | None = None
    # Bytes per token and head slot for packed formats the dtype cannot describe.
    state_content_bytes: int | None = None
    # Distinct tensor-parallel shards of this layer's heads; ranks beyond replicate.
    max_tp_shards: int | None = None
    # Tokens one stored state covers (DeepSeek-V4's compressed attention: the ratio).
    tokens_per_state: int = 1

    kind: ClassVar[str] = "attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "num_kv_heads", "head_size")
        optional = ("max_tp_shards", "state_content_bytes", "page_size_padded")
        check_fields(self, *optional, allow_none=True)
        check_fields(self, "tokens_per_state")
        if self.block_size % self.tokens_per_state:
            raise KVCacheSpecError(
                f"{type(self).__name__}.block_size ({self.block_size}) must be a multiple of "
                f"tokens_per_state ({self.tokens_per_state})"
            )
        object.__setattr__(self, "dtype", spec_dtype_name(self, "dtype", self.dtype))
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        check_fields(self, "head_size_v", minimum=0)
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise KVCacheSpecError(
                f"{type(self).__name__}.page_size_padded ({self.page_size_padded}) is smaller "
                f"than the real page size ({self.real_page_size_bytes})"
            )

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one stored state (a token, unless ``tokens_per_state`` > 1)
        over all this layer's KV heads (scales included)."""
        if self.state_content_bytes is not None:
            return self.num_kv_heads * self.state_content_bytes
        fmt = get_kv_dtype(self.dtype)
        head_size_v = self.head_size_v or 0
        per_head = fmt.bytes_per_vector(self.head_size) + fmt.bytes_per_vector(head_size_v)
        return self.num_kv_heads * per_head

    @property
    def real_page_size_bytes(self) -> int:
        return self.block_size // self.tokens_per_state * self.bytes_per_token

    @property
    def page_size_bytes(self) -> int:
        return self.real_page_size_bytes if self.page_size_padded is None else self.page_size_padded

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not say how long blocks live")

    def copy_with_new_block_size(self, block_size: int) -> Self:
        # A padded page scales with the block size; the real page is recomputed.
        padded = self.page_size_padded
        if padded is not None:
            padded = padded * block_size // self.block_size
        return dataclasses.replace(self, block_size=block_size, page_size_padded=padded)
