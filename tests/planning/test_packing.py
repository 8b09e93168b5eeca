"""Block-outermost layouts: vLLM's packed grouping of mixed page sizes, hidden-state
groups, and cross-layer KV sharing."""

from __future__ import annotations

import pytest
import torch

from pagedkv import (
    CircularBufferSpec,
    EngineConfig,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.errors import ConfigError, PlanningError
from pagedkv.planning import get_kv_cache_configs
from pagedkv.planning.layout import is_block_outermost
from pagedkv.planning.packing import approximate_gcd, packed_kv_cache_groups
from pagedkv.tensors import allocate_kv_cache

GiB = 1 << 30


def attn(heads: int, block_size: int = 16) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=128)


def config(layout: str, **options: object) -> EngineConfig:
    return EngineConfig.create(max_model_len=4096, kv_cache_layout=layout, **options)


def test_approximate_gcd_minimises_padding_and_prefers_the_larger() -> None:
    assert approximate_gcd([6, 12]) == 6  # 1, 2, 3 and 6 pad nothing: the largest
    assert approximate_gcd([6, 12], 7) == 7  # 7 pads 1 + 2; 12 would pad 6
    assert approximate_gcd([3, 5], 4) == 5  # 4 pads 1 + 3, 5 pads 2
    assert approximate_gcd([3, 5], 7) == 7  # above every value: the bound
    with pytest.raises(PlanningError):
        approximate_gcd([0, 3])


def test_reference_example_packs_attention_and_splits_mamba() -> None:
    # Reference 6.7: 6 layers of 64 KiB + 6 of 32 KiB (balanced) and 12 Mamba layers of
    # 96 KiB: one attention group of 576 KiB; Mamba in two groups of 6 (576 KiB each).
    specs: dict[str, KVCacheSpec] = {}
    for i in range(6):
        specs[f"big.{i}"] = attn(8)  # 16 tokens x 8 heads x (K + V) 512 B = 64 KiB
        specs[f"small.{i}"] = attn(4)
    for i in range(12):
        specs[f"ssm.{i}"] = MambaSpec(block_size=16, shapes=((96 * 512,),), dtypes=("bf16",))
    groups = packed_kv_cache_groups(specs)
    widths = [sum(s.page_size_bytes for s in g.layer_specs().values()) for g in groups]
    assert widths == [576 * 1024] * 3
    assert [len(g.layer_names) for g in groups] == [12, 6, 6]
    assert groups[1].layer_names == tuple(f"ssm.{i}" for i in range(0, 12, 2))


def test_ring_layout_keeps_the_ring_block_size_block_outer() -> None:
    # The golden `ring` layout: vLLM plans it with BLNHC, ring block 4 (2 KiB page).
    specs = {
        "l0": attn(8),
        "l1": attn(8),
        "tail": CircularBufferSpec(block_size=4, num_kv_heads=2, head_size=128, head_size_v=0),
    }
    (kv,) = get_kv_cache_configs(config("BLNHC"), [specs], [GiB])
    assert [g.layer_names for g in kv.kv_cache_groups] == [("l0", "l1"), ("tail",)]
    assert [g.kv_cache_spec.block_size for g in kv.kv_cache_groups] == [16, 4]
    assert {t.block_stride for t in kv.kv_cache_tensors} == {131072}
    # Layer-outermost: the ring's page is scaled up to the attention page (block 128).
    (lb,) = get_kv_cache_configs(config("LBNHC"), [specs], [GiB])
    assert [g.kv_cache_spec.block_size for g in lb.kv_cache_groups] == [16, 16, 128]


def test_layouts_are_resolved_by_name() -> None:
    assert is_block_outermost("BLNHC") and is_block_outermost("BHLNC")
    assert not is_block_outermost("LBNHC") and not is_block_outermost("NHD")
    with pytest.raises(ConfigError, match="kv_cache_layout"):
        get_kv_cache_configs(config("BNL"), [{"a": attn(8)}], [GiB])


def test_hidden_state_layers_get_groups_of_their_own() -> None:
    specs: dict[str, KVCacheSpec] = {
        "full.0": attn(8),
        "swa.0": SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, sliding_window=64),
        "hidden": HiddenStateCacheSpec(block_size=16, head_size=4096),
    }
    (kv,) = get_kv_cache_configs(config("NHD"), [specs], [GiB])
    hidden = kv.kv_cache_groups[-1]
    assert hidden.layer_names == ("hidden",)
    # Common page 64 KiB; a token's hidden state is 8 KiB: block 8 (divides 16), padded.
    assert hidden.kv_cache_spec.block_size == 8
    assert hidden.kv_cache_spec.page_size_bytes == 65536


def test_kv_sharing_layers_join_their_targets_group_and_tensors() -> None:
    specs = {"l0": attn(2), "l1": attn(2)}
    shared = {"l2": "l0", "l3": "l1"}
    (kv,) = get_kv_cache_configs(config("NHD"), [specs], [1 << 24], shared_kv_cache_layers=shared)
    assert kv.shared_kv_cache_layers == (("l2", "l0"), ("l3", "l1"))
    assert kv.group_layer_names(0) == ("l0", "l1", "l2", "l3")
    (plain,) = get_kv_cache_configs(config("NHD"), [specs], [1 << 24])
    assert kv.num_blocks == plain.num_blocks  # sharing layers cost nothing
    memory = allocate_kv_cache(kv)
    assert memory["l2"].tensors[0].data_ptr() == memory["l0"].tensors[0].data_ptr()
    memory["l0"].tensors[0].fill_(3)
    assert torch.all(memory["l2"].tensors[0] == 3)


@pytest.mark.parametrize(
    ("shared", "message"),
    [
        ({"l0": "l0"}, "its own"),
        ({"l1": "l0"}, "spec of its own"),
        ({"l2": "nowhere"}, "no KV cache spec"),
        ({"l2": "l0", "l3": "l2"}, "'l2', which has no KV cache spec"),
    ],
)
def test_bad_kv_sharing_names_the_layer(shared: dict[str, str], message: str) -> None:
    specs = {"l0": attn(2), "l1": attn(2)}
    with pytest.raises(PlanningError, match=message):
        get_kv_cache_configs(config("NHD"), [specs], [GiB], shared_kv_cache_layers=shared)
