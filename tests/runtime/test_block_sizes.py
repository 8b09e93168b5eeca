"""The token granularities of a hybrid model's KV cache (``runtime.block_sizes``):
hits inside a block must still end on whole compressed states."""

from __future__ import annotations

import pytest

from pagedkv import FullAttentionSpec, MambaSpec, MLAAttentionSpec
from pagedkv.errors import ConfigError
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.runtime.block_sizes import resolve_block_sizes


def groups(tokens_per_state: int | None) -> list[KVCacheGroupSpec]:
    """A Mamba "align" group (hits inside its 64-token block), full attention hashed
    every 16 tokens and, optionally, a compressed MLA layer."""
    specs = {
        "ssm": MambaSpec(
            block_size=64, shapes=((128,),), dtypes=("bfloat16",), mamba_cache_mode="align"
        ),
        "attn": FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64),
    }
    if tokens_per_state is not None:
        specs["compressed"] = MLAAttentionSpec(
            block_size=32, num_kv_heads=1, head_size=64, tokens_per_state=tokens_per_state
        )
    return [KVCacheGroupSpec(layer_names=(n,), kv_cache_spec=s) for n, s in specs.items()]


def test_partial_hits_land_on_the_hash_block() -> None:
    sizes = resolve_block_sizes(groups(None), enable_caching=True, prefix_match_unit=None)
    assert sizes == (64, 16, 16, True)
    whole = resolve_block_sizes(groups(16), enable_caching=True, prefix_match_unit=None)
    assert whole.cache_hit_alignment_tokens == 16


def test_partial_hits_inside_a_compressed_state_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"per-state compression \(tokens per state \[32\]\)"):
        resolve_block_sizes(groups(32), enable_caching=True, prefix_match_unit=None)
    # Without prefix caching no hit lands inside a block.
    sizes = resolve_block_sizes(groups(32), enable_caching=False, prefix_match_unit=None)
    assert sizes.hash_block_size == 64
