"""Spec dictionaries for the worked examples of the reference (section 8)."""

from __future__ import annotations

from pagedkv.planning import KVCacheConfig
from pagedkv.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

GiB = 1 << 30
KiB = 1 << 10


def full(heads: int = 8, head: int = 128, bs: int = 16, **kw: object) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=head, **kw)  # type: ignore[arg-type]


def sliding(window: int, heads: int = 8, head: int = 128, bs: int = 16) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=bs, num_kv_heads=heads, head_size=head, sliding_window=window
    )


def mamba1(bs: int = 16, mode: str = "align", inner: int = 8192) -> MambaSpec:
    return MambaSpec(
        block_size=bs,
        shapes=((inner, 3), (inner, 16)),
        dtypes=("bfloat16", "bfloat16"),
        mamba_type="mamba1",
        mamba_cache_mode=mode,  # type: ignore[arg-type]
    )


def llama_8b(
    num_layers: int = 32, heads: int = 8, dtype: str = "bfloat16"
) -> dict[str, KVCacheSpec]:
    return {
        f"layers.{i}": FullAttentionSpec(
            block_size=16, num_kv_heads=heads, head_size=128, dtype=dtype
        )
        for i in range(num_layers)
    }


def gemma3_27b() -> dict[str, KVCacheSpec]:
    out: dict[str, KVCacheSpec] = {}
    for i in range(62):
        is_full = (i + 1) % 6 == 0
        out[f"layers.{i}"] = full(heads=16) if is_full else sliding(1024, heads=16)
    return out


def jamba(mode: str = "align") -> dict[str, KVCacheSpec]:
    return {f"layers.{i}": full() if i % 8 == 4 else mamba1(mode=mode) for i in range(32)}


def deepseek_v3(num_layers: int = 61) -> dict[str, KVCacheSpec]:
    return {
        f"layers.{i}": MLAAttentionSpec(block_size=64, head_size=576) for i in range(num_layers)
    }


def group_spec_of(config: KVCacheConfig, layer_name: str) -> KVCacheSpec:
    """The spec of the group holding ``layer_name``."""
    (group,) = (g for g in config.kv_cache_groups if layer_name in g.layer_names)
    return group.kv_cache_spec
