"""No two layers clobber each other, unless the plan aliases them on purpose."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

torch = pytest.importorskip("torch")

from pagedkv.tensors import UnsafeOverlap, allocate_kv_cache, find_unsafe_overlaps  # noqa: E402
from pagedkv.tensors.overlap import sweep_unsafe_overlaps  # noqa: E402

from .configs import block_outer_config, layer_outer_config  # noqa: E402


@st.composite
def specs(draw: st.DrawFn, block_size: int):
    kind = draw(st.sampled_from(["full", "window", "chunk", "mla", "mamba"]))
    heads = draw(st.integers(1, 3))
    head = draw(st.sampled_from([2, 4, 6]))
    dtype = draw(st.sampled_from(["float32", "float16"]))
    common = dict(block_size=block_size, num_kv_heads=heads, head_size=head, dtype=dtype)
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "window":
        return SlidingWindowSpec(**common, sliding_window=draw(st.integers(1, 9)))
    if kind == "chunk":
        return ChunkedLocalAttentionSpec(**common, attention_chunk_size=draw(st.integers(1, 9)))
    if kind == "mla":
        return MLAAttentionSpec(block_size=block_size, head_size=head, dtype=dtype)
    return MambaSpec(
        block_size=block_size, shapes=((heads, head), (head,)), dtypes=("float32", dtype)
    )


@st.composite
def plans(draw: st.DrawFn) -> KVCacheConfig:
    block_size = draw(st.sampled_from([1, 2, 4]))
    num_groups = draw(st.integers(1, 3))
    groups = []
    for gid in range(num_groups):
        spec = draw(specs(block_size))
        names = [f"g{gid}.l{i}" for i in range(draw(st.integers(1, 3)))]
        groups.append((spec, names))
    num_blocks = draw(st.integers(1, 6))
    builder = draw(st.sampled_from([layer_outer_config, block_outer_config]))
    return builder(groups, num_blocks, layout=draw(st.sampled_from(["NHD", "HND"])))


@settings(max_examples=60, deadline=None)
@given(plan=plans(), data=st.data())
def test_owned_pages_keep_their_data(plan: KVCacheConfig, data: st.DataObject) -> None:
    """Give every block id to at most one group, fill each owned page with its own
    value through the typed views, and read every one back intact."""
    assert find_unsafe_overlaps(plan) == []
    memory = allocate_kv_cache(plan)
    num_groups = len(plan.kv_cache_groups)
    owner = data.draw(
        st.lists(
            st.integers(-1, num_groups - 1), min_size=plan.num_blocks, max_size=plan.num_blocks
        )
    )
    expected = {}
    for name, view in memory.layers.items():
        for block in range(plan.num_blocks):
            if owner[block] == view.group_id:
                value = float(len(expected) + 1)
                expected[name, block] = value
                for tensor in view.tensors:
                    tensor[block].fill_(value)
    for (name, block), value in expected.items():
        for tensor in memory[name].tensors:
            assert torch.all(tensor[block] == value), (name, block)


def test_unequal_pages_need_the_largest_block_stride() -> None:
    """A layer-outer plan whose smaller-page group strides by its own page lets block 1
    of one group overlap block 0 of the other: the checker names it."""
    small = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=4, dtype="float32")
    big = dataclasses.replace(small, num_kv_heads=2)
    good = layer_outer_config([(small, ["s"]), (big, ["b"])], num_blocks=4)
    assert find_unsafe_overlaps(good) == []
    bad_tensor = dataclasses.replace(good.kv_cache_tensors[0], block_stride=small.page_size_bytes)
    bad = dataclasses.replace(good, kv_cache_tensors=(bad_tensor, good.kv_cache_tensors[1]))
    found = find_unsafe_overlaps(bad, limit=100)
    assert UnsafeOverlap("b", 0, "s", 1) in found
    assert all({o.layer_a, o.layer_b} == {"s", "b"} for o in found)


def test_layers_of_one_group_must_not_share_pages() -> None:
    spec = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=4, dtype="float32")
    good = layer_outer_config([(spec, ["x", "y"])], num_blocks=3)
    assert find_unsafe_overlaps(good) == []
    squeezed = dataclasses.replace(good.kv_cache_tensors[0], layer_stride=spec.page_size_bytes * 2)
    bad = dataclasses.replace(good, kv_cache_tensors=(squeezed,))
    assert find_unsafe_overlaps(bad) == [UnsafeOverlap("x", 2, "y", 0)]
    assert len(find_unsafe_overlaps(bad, limit=1)) == 1


def test_same_block_id_across_groups_is_shared_on_purpose() -> None:
    spec = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=4, dtype="float32")
    window = SlidingWindowSpec(
        block_size=2, num_kv_heads=1, head_size=4, dtype="float32", sliding_window=3
    )
    plan = layer_outer_config([(spec, ["f"]), (window, ["w"])], num_blocks=3)
    regions = plan.layer_regions()
    assert regions["f"].block_range(1) == regions["w"].block_range(1)  # aliased
    assert find_unsafe_overlaps(plan) == []
    # Put both layers in one group and the same aliasing becomes a bug.
    merged = dataclasses.replace(
        plan,
        kv_cache_groups=(dataclasses.replace(plan.kv_cache_groups[0], layer_names=("f", "w")),),
    )
    assert UnsafeOverlap("f", 0, "w", 0) in find_unsafe_overlaps(merged)


@st.composite
def arbitrary_plans(draw: st.DrawFn) -> KVCacheConfig:
    """Plans with arbitrary (often broken) placements, one tensor per group."""
    num_blocks = draw(st.integers(1, 6))
    tensors, groups = [], []
    spec = FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=2, dtype="float32")
    for gid in range(draw(st.integers(1, 3))):
        names = tuple(f"g{gid}.l{i}" for i in range(draw(st.integers(1, 3))))
        tensors.append(
            KVCacheTensor(
                size=4096,
                layers=names,
                layer_stride=draw(st.integers(0, 40)),
                block_stride=draw(st.integers(1, 40)),
                page_size_bytes=draw(st.integers(1, 40)),
                offset=draw(st.integers(0, 40)),
            )
        )
        groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=tuple(tensors), kv_cache_groups=tuple(groups)
    )


def _pairs(overlaps: list[UnsafeOverlap]) -> set[frozenset[str]]:
    return {frozenset((o.layer_a, o.layer_b)) for o in overlaps}


@settings(max_examples=200, deadline=None)
@given(config=arbitrary_plans())
@pytest.mark.slow
def test_closed_form_agrees_with_brute_force(config: KVCacheConfig) -> None:
    fast = find_unsafe_overlaps(config, limit=10**6)
    slow = sweep_unsafe_overlaps(config, limit=10**6)
    assert _pairs(fast) == _pairs(slow)
    regions = config.layer_regions()
    group = {n: g for g, grp in enumerate(config.kv_cache_groups) for n in grp.layer_names}
    for o in fast:  # every report is a real, unintended overlap
        a0, a1 = regions[o.layer_a].block_range(o.block_a)
        b0, b1 = regions[o.layer_b].block_range(o.block_b)
        assert a0 < b1 and b0 < a1
        assert not (o.block_a == o.block_b and group[o.layer_a] != group[o.layer_b])
