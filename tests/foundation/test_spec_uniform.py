"""is_uniform_with_collection, UniformTypeKVCacheSpecs (edge cases 47, 48)."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.config import EngineConfig
from pagedkv.errors import KVCacheSpecError, RegistryError
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from .spec_variants import ATTN

pytestmark = pytest.mark.usefixtures("registry")

FULL = FullAttentionSpec(**ATTN)
MLA = MLAAttentionSpec(block_size=16, head_size=576)
SINK = SinkFullAttentionSpec(**ATTN, sink_len=16)
SW = SlidingWindowSpec(**ATTN, sliding_window=128)
SW_MLA = SlidingWindowMLASpec(block_size=16, head_size=576, sliding_window=128)


def layers(*specs: KVCacheSpec) -> dict[str, KVCacheSpec]:
    return {f"layer.{i}": spec for i, spec in enumerate(specs)}


def test_base_uses_registered_uniform_base_and_isinstance() -> None:
    collection = layers(FULL, MLA, FullAttentionSpec(**{**ATTN, "num_kv_heads": 2}))
    assert FULL.is_uniform_with_collection(collection)
    assert MLA.is_uniform_with_collection(collection)  # MLA's base is FullAttentionSpec
    assert not FULL.is_uniform_with_collection(layers(FULL, SW))


def test_base_follows_the_registry() -> None:
    class OtherManager:
        pass

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class OwnKind(FullAttentionSpec):
        pass

    own = OwnKind(**ATTN)
    KVCacheSpecRegistry.register(OwnKind, OtherManager)  # its own base kind
    assert own.is_uniform_with_collection(layers(own, OwnKind(**{**ATTN, "num_kv_heads": 1})))
    assert not own.is_uniform_with_collection(layers(own, FULL))
    # Full attention's base still accepts it: it is a FullAttentionSpec.
    assert FULL.is_uniform_with_collection(layers(FULL, own))
    assert not UniformTypeKVCacheSpecs.is_uniform_type(layers(FULL, own))


def test_unregistered_spec_cannot_answer() -> None:
    with pytest.raises(RegistryError, match="AttentionSpec"):
        AttentionSpec(**ATTN).is_uniform_with_collection(layers(FULL))


def test_sliding_window_needs_equal_windows() -> None:
    other_window = SlidingWindowSpec(**ATTN, sliding_window=256)
    assert SW.is_uniform_with_collection(
        layers(SW, SlidingWindowSpec(**{**ATTN, "num_kv_heads": 1}, sliding_window=128))
    )
    assert not SW.is_uniform_with_collection(layers(SW, other_window))
    assert not SW.is_uniform_with_collection(layers(SW, FULL))
    # extra_retained_tokens does not matter for uniformity.
    extra = SlidingWindowSpec(**ATTN, sliding_window=128, extra_retained_tokens=3)
    assert SW.is_uniform_with_collection(layers(SW, extra))


def test_chunked_local_needs_equal_chunks() -> None:
    chunk = ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=8192)
    assert chunk.is_uniform_with_collection(
        layers(chunk, dataclasses.replace(chunk, num_kv_heads=2))
    )
    assert not chunk.is_uniform_with_collection(
        layers(chunk, dataclasses.replace(chunk, attention_chunk_size=4096))
    )


def test_mamba_uniformity_fields() -> None:
    mamba = MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("bf16",))
    same_page = MambaSpec(block_size=16, shapes=((2, 8),), dtypes=("bf16",))
    assert mamba.is_uniform_with_collection(layers(mamba, same_page))
    for other in (
        MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("fp32",)),
        dataclasses.replace(mamba, num_speculative_blocks=1),
        dataclasses.replace(mamba, mamba_cache_mode="align"),
        FULL,
    ):
        assert not mamba.is_uniform_with_collection(layers(mamba, other))


@pytest.mark.parametrize(
    "specs",
    [(SW, SW_MLA), (SW_MLA, SW)],
    ids=["sw-then-swmla", "swmla-then-sw"],
)
def test_is_uniform_type_does_not_depend_on_order(specs: tuple[KVCacheSpec, ...]) -> None:
    # Edge 47: vLLM answers with the first spec's override (SW first -> uniform,
    # SW-MLA first -> not). pagedkv asks every spec, so both orders say no.
    assert SW.is_uniform_with_collection(layers(*specs))
    assert not SW_MLA.is_uniform_with_collection(layers(*specs))
    assert not UniformTypeKVCacheSpecs.is_uniform_type(layers(*specs))
    assert UniformTypeKVCacheSpecs.from_specs(layers(*specs)) is None


@pytest.mark.parametrize("specs", [(FULL, MLA), (MLA, FULL)], ids=["full-mla", "mla-full"])
def test_full_and_mla_form_one_uniform_group_in_either_order(
    specs: tuple[KVCacheSpec, ...],
) -> None:
    assert UniformTypeKVCacheSpecs.is_uniform_type(layers(*specs))


@pytest.mark.parametrize("specs", [(FULL, SINK), (SINK, FULL)], ids=["full-sink", "sink-full"])
def test_uniform_group_needs_one_manager(specs: tuple[KVCacheSpec, ...]) -> None:
    # Both have base FullAttentionSpec but different managers: the group's manager
    # would depend on which layer comes first, so they are not one uniform group.
    assert all(s.is_uniform_with_collection(layers(*specs)) for s in specs)
    assert not UniformTypeKVCacheSpecs.is_uniform_type(layers(*specs))


def test_mixed_block_sizes_are_not_uniform() -> None:
    # Edge 48.
    assert not UniformTypeKVCacheSpecs.is_uniform_type(
        layers(FULL, FULL.copy_with_new_block_size(32))
    )
    assert not UniformTypeKVCacheSpecs.is_uniform_type({})


def test_uniform_group_sizes() -> None:
    group = UniformTypeKVCacheSpecs.from_specs(layers(FULL, MLA, FULL))
    assert group is not None
    assert group.block_size == 16
    assert group.page_size_bytes == 2 * 65_536 + 18_432
    assert group.real_page_size_bytes == group.page_size_bytes
    assert group.prefix_cacheable
    config = EngineConfig.create(max_model_len=1_000)
    assert group.max_num_blocks_per_req(config) == 63
    assert group.max_memory_usage_blocks(config) == 63
    assert group.max_memory_usage_bytes(config) == 63 * group.page_size_bytes
    bigger = group.copy_with_new_block_size(32)
    assert bigger.block_size == 32
    assert all(s.block_size == 32 for s in bigger.kv_cache_specs.values())
    assert bigger.page_size_bytes == 2 * group.page_size_bytes


def test_uniform_group_with_disagreeing_rows_is_an_error() -> None:
    window = SlidingWindowSpec(**ATTN, sliding_window=128)
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=("bf16",))
    group = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs=layers(window, mamba))
    with pytest.raises(KVCacheSpecError, match="block-table entries"):
        group.max_num_blocks_per_req(EngineConfig.create(max_model_len=1_000))
