"""KV cache element formats by name, with their bytes per vector (scales included)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedkv.errors import UnknownDtypeError

__all__ = [
    "KVCacheDtype",
    "DTYPES",
    "known_dtype_names",
    "canonical_dtype_name",
    "get_kv_dtype",
    "dtype_size",
]


@dataclass(frozen=True)
class KVCacheDtype:
    """One storage format: ``scale_bytes`` per ``scale_group`` elements (0: per vector)."""

    name: str
    bits: int
    scale_bytes: int = 0
    scale_group: int = 0
    is_float: bool = True

    def bytes_per_vector(self, num_elements: int) -> int:
        """Bytes one vector of ``num_elements`` takes, scales included."""
        if num_elements <= 0:
            return 0
        data = -(-num_elements * self.bits // 8)
        if not self.scale_bytes:
            return data
        num_scales = 1 if self.scale_group == 0 else -(-num_elements // self.scale_group)
        return data + num_scales * self.scale_bytes


_DTYPES: tuple[tuple[KVCacheDtype, tuple[str, ...]], ...] = (
    (KVCacheDtype("bfloat16", 16), ("bf16",)),
    (KVCacheDtype("float16", 16), ("fp16", "half")),
    (KVCacheDtype("float32", 32), ("fp32", "float")),
    (KVCacheDtype("fp8_e4m3", 8), ("fp8", "float8_e4m3fn", "fp8_inc")),
    (KVCacheDtype("fp8_e5m2", 8), ("float8_e5m2",)),
    (KVCacheDtype("int8", 8, is_float=False), ()),
    (KVCacheDtype("uint8", 8, is_float=False), ()),
    # Per-token-head formats keep one fp32 scale inline per K and per V vector.
    (KVCacheDtype("int8_per_token_head", 8, 4, 0, is_float=False), ()),
    (KVCacheDtype("fp8_per_token_head", 8, 4, 0), ()),
    (KVCacheDtype("int4_per_token_head", 4, 4, 0, is_float=False), ("int4",)),
    # DeepSeek's packed MLA format; models/ sizes its 656-byte token blob (MLA only).
    (KVCacheDtype("fp8_ds_mla", 8), ()),
    # NVFP4: 4-bit elements with one 1-byte (e4m3) scale per 16 elements.
    (KVCacheDtype("nvfp4", 4, 1, 16), ("fp4",)),
)

DTYPES: dict[str, KVCacheDtype] = {d.name: d for d, _ in _DTYPES}
_ALIASES: dict[str, str] = {alias: d.name for d, aliases in _DTYPES for alias in aliases}


def known_dtype_names() -> list[str]:
    """Canonical names followed by aliases."""
    return [*DTYPES, *_ALIASES]


def canonical_dtype_name(dtype: Any) -> str:
    """Canonical name of a dtype given by name or as a torch dtype."""
    name = dtype if isinstance(dtype, str) else str(dtype)
    key = name.strip().lower().removeprefix("torch.")
    if key in DTYPES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise UnknownDtypeError(
        f"unknown KV cache dtype {name!r}; known: {', '.join(known_dtype_names())}"
    )


def get_kv_dtype(dtype: Any) -> KVCacheDtype:
    """The format of a dtype given by name (or alias) or as a torch dtype."""
    fmt = DTYPES.get(dtype) if isinstance(dtype, str) else None
    return fmt if fmt is not None else DTYPES[canonical_dtype_name(dtype)]


def dtype_size(dtype: Any) -> int:
    """Bytes per element for whole-byte formats (Mamba states, torch storage)."""
    spec = get_kv_dtype(dtype)
    if spec.bits % 8 or spec.scale_bytes:
        raise UnknownDtypeError(f"dtype {spec.name!r} has no whole-byte element size")
    return spec.bits // 8
