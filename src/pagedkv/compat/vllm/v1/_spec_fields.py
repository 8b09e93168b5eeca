"""vLLM's spec classes as subclasses of pagedkv's: each gains the vLLM fields pagedkv's
class lacks. Fields that only describe kernels or metadata are kept as given; a value
that would change the cache's size or lifetime in a way pagedkv cannot express raises."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pagedkv.compat.vllm.config._engine_config import as_engine_config
from pagedkv.dtypes import canonical_dtype_name
from pagedkv.errors import KVCacheSpecError
from pagedkv.specs import full as _specs_full
from pagedkv.specs.base import merge_checked

__all__ = ["DtypeName", "SpecMergeError", "vllm_spec_class"]


class DtypeName(str):
    """pagedkv's canonical dtype name that also equals the torch dtype it names, as vLLM's
    specs carry ``torch.dtype`` values (``spec.dtype == torch.float32``)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other)
        if type(other).__name__ == "dtype" and type(other).__module__ == "torch":
            return str(self) == canonical_dtype_name(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = str.__hash__


# Field -> default for the vLLM fields of each family (only those pagedkv lacks are added).
BASE_FIELDS: dict[str, Any] = {"dcp_sharded": False, "block_stride_alignment": None}
ATTENTION_FIELDS: dict[str, Any] = {
    "dcp_sharded": True,
    "kv_quant_mode": 0,
    "num_head_slots": None,
    "tokens_per_state": 1,
}
FULL_FIELDS: dict[str, Any] = {"non_causal": False}
MLA_FIELDS: dict[str, Any] = {
    "cache_dtype_str": None,
    "topk_buffer_width": None,
    "alignment": None,
    "model_version": None,
    "cache_role": "sparse",
    "is_index_group_leader": False,
    "non_causal_multi_token_decode": False,
}
SWA_MLA_FIELDS: dict[str, Any] = {
    "cache_dtype_str": None,
    "alignment": None,
    "model_version": None,
    "bounded_replay": False,
}
MAMBA_FIELDS: dict[str, Any] = {
    "num_prefill_checkpoint_blocks": 0,
    "prefill_checkpoint_alignment": None,
    "num_heads": 1,
    "tokens_per_state": -1,
    "tp_replicated": False,
}


def _check_translatable(spec: Any, added: frozenset[str]) -> None:
    """Values of added fields that would change what pagedkv sizes or keeps."""
    name = type(spec).__name__
    if "num_head_slots" in added:
        slots = spec.num_head_slots
        if slots is not None and slots != spec.num_kv_heads:
            raise KVCacheSpecError(f"{name}.num_head_slots={slots} differs from num_kv_heads")
    if "tokens_per_state" in added and hasattr(spec, "num_kv_heads") and spec.tokens_per_state != 1:
        raise KVCacheSpecError(f"{name}.tokens_per_state={spec.tokens_per_state} != 1")
    if "num_prefill_checkpoint_blocks" in added and spec.num_prefill_checkpoint_blocks:
        raise KVCacheSpecError(f"{name}.num_prefill_checkpoint_blocks needs pagedkv support")
    if "alignment" in added and spec.alignment:
        real = spec.real_page_size_bytes
        padded = -(-real // spec.alignment) * spec.alignment
        if padded != real:
            object.__setattr__(spec, "page_size_padded", padded)


class SpecMergeError(KVCacheSpecError, AssertionError):
    """Specs that cannot share one group: pagedkv's error, and vLLM's AssertionError."""


def _check_alignment(spec: Any) -> None:
    alignment = getattr(spec, "block_stride_alignment", None)
    if alignment is None:
        return
    if type(alignment) is not int or alignment <= 0:
        raise KVCacheSpecError(
            f"{type(spec).__name__}.block_stride_alignment must be positive, got {alignment!r}"
        )


def _alignment_bytes(spec: Any) -> int:
    """vLLM's ``block_stride_alignment`` (bytes; None: any stride)."""
    alignment = getattr(spec, "block_stride_alignment", None)
    return alignment if type(alignment) is int else 1


def _dcp_shards(spec: Any, config: Any) -> int:
    """Ranks a DCP-sharded spec's tokens spread over under ``config`` (1 otherwise)."""
    if not getattr(spec, "dcp_sharded", False):
        return 1
    parallel = getattr(config, "parallel_config", None)
    return int(getattr(parallel, "decode_context_parallel_size", 1) or 1)


def vllm_spec_class(
    name: str,
    bases: tuple[type, ...],
    extra: dict[str, Any],
    overrides: dict[str, Any] | None = None,
) -> type:
    """A frozen dataclass ``name`` over ``bases`` with the ``extra`` fields the bases lack
    and ``overrides`` (field -> new default)."""
    have = {f.name for b in bases for f in dataclasses.fields(b)}
    added = {k: v for k, v in extra.items() if k not in have}
    spec_fields: list[Any] = [(k, Any, dataclasses.field(default=v)) for k, v in added.items()]
    for k, v in (overrides or {}).items():
        spec_fields.append((k, Any, dataclasses.field(default=v)))
    added_names = frozenset(added)
    # The last base is pagedkv's own kind: its __post_init__ (padding an MLA page to its
    # alignment, say) runs the rest of the chain through super().
    core_post_init: Callable[[Any], None] = getattr(bases[-1], "__post_init__")  # noqa: B009

    def __post_init__(self: Any) -> None:
        shapes = getattr(self, "shapes", None)
        if isinstance(shapes, tuple) and shapes and all(type(d) is int for d in shapes):
            object.__setattr__(self, "shapes", (shapes,))  # a flat tuple is one state shape
        dtypes: Any = getattr(self, "dtypes", None)
        states: Any = getattr(self, "shapes", None)
        paired = isinstance(dtypes, tuple | list) and isinstance(states, tuple | list)
        if paired and len(dtypes) > len(states):
            # vLLM pairs states with dtypes by zip: dtypes past the last state are unused
            object.__setattr__(self, "dtypes", tuple(dtypes[: len(states)]))
        core_post_init(self)
        if isinstance(getattr(self, "dtype", None), str):
            object.__setattr__(self, "dtype", DtypeName(self.dtype))
        _check_translatable(self, added_names)
        _check_alignment(self)

    core: Any = bases[0]
    core_merge = core.merge
    # Fields pagedkv's merge reconciles (a full-attention group's promoted windows): a
    # mismatch there is a ValueError, anywhere else vLLM's AssertionError.
    reconciled = (
        ("sliding_window", "attention_chunk_size")
        if any(issubclass(b, _specs_full.FullAttentionSpec) for b in bases)
        else ()
    )

    def merge(cls: Any, specs: Any) -> Any:
        try:
            merge_checked(cls, specs, reconciled=reconciled)
        except KVCacheSpecError as exc:
            raise SpecMergeError(str(exc)) from exc
        return core_merge.__func__(cls, specs)

    core_blocks_per_req = core.max_num_blocks_per_req
    core_memory = core.max_memory_usage_bytes
    is_full = any(issubclass(b, _specs_full.FullAttentionSpec) for b in bases)

    def max_num_blocks_per_req(self: Any, config: Any, max_len: int | None = None) -> int:
        shards = _dcp_shards(self, config)
        if shards == 1:
            return int(core_blocks_per_req(self, as_engine_config(config), max_len))
        length = as_engine_config(config).max_model_len if max_len is None else max_len
        return -(-length // (self.block_size * shards))

    def max_memory_usage_bytes(self: Any, config: Any) -> int:
        shards = _dcp_shards(self, config)
        if shards == 1 or not is_full:
            return int(core_memory(self, as_engine_config(config)))
        tokens_per_rank = -(-as_engine_config(config).max_model_len // shards)
        return -(-tokens_per_rank // self.block_size) * int(self.page_size_bytes)

    made: type = dataclasses.make_dataclass(
        name,
        spec_fields,
        bases=bases,
        namespace={
            "__post_init__": __post_init__,
            "__module__": "pagedkv.compat.vllm.v1.kv_cache_interface",
            "merge": classmethod(merge),
            "block_stride_alignment_bytes": _alignment_bytes,
            "get_block_stride_alignment": _alignment_bytes,
            # vLLM's name for the page before padding
            "unpadded_page_size_bytes": property(lambda self: self.real_page_size_bytes),
            "max_num_blocks_per_req": max_num_blocks_per_req,
            "max_memory_usage_bytes": max_memory_usage_bytes,
        },
        frozen=True,
        kw_only=True,
    )
    return made
