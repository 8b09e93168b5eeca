"""Hypothesis: merge and is_uniform_with_collection agree, and neither depends on order."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv.errors import KVCacheSpecError
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from startup_state import isolated

from .managers import register_test_managers
from .spec_variants import altered, compared_field_names

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

block_sizes = st.sampled_from([16, 32])
heads = st.sampled_from([1, 2, 8])
head_sizes = st.sampled_from([64, 128])
dtypes = st.sampled_from(["bfloat16", "float16"])
windows = st.sampled_from([64, 128])


@st.composite
def attention_fields(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "block_size": draw(block_sizes),
        "num_kv_heads": draw(heads),
        "head_size": draw(head_sizes),
        "dtype": draw(dtypes),
    }


@st.composite
def base_specs(draw: st.DrawFn) -> KVCacheSpec:
    attn = draw(attention_fields())
    kind = draw(st.sampled_from(range(9)))
    if kind == 0:
        return FullAttentionSpec(**attn)
    if kind == 1:
        return FullAttentionSpec(**attn, sliding_window=draw(windows))
    if kind == 2:
        return MLAAttentionSpec(block_size=attn["block_size"], head_size=576, dtype=attn["dtype"])
    if kind == 3:
        return SinkFullAttentionSpec(**attn, sink_len=draw(st.sampled_from([16, 32])))
    if kind == 4:
        return SlidingWindowSpec(**attn, sliding_window=draw(windows))
    if kind == 5:
        return SlidingWindowMLASpec(
            block_size=attn["block_size"], head_size=576, sliding_window=draw(windows)
        )
    if kind == 6:
        return ChunkedLocalAttentionSpec(**attn, attention_chunk_size=draw(windows))
    if kind == 7:
        return CrossAttentionSpec(**attn)
    return MambaSpec(
        block_size=attn["block_size"],
        shapes=((draw(heads), 4), (4,)),
        dtypes=(attn["dtype"], "float32"),
    )


@st.composite
def variant(draw: st.DrawFn, base: KVCacheSpec, pool: list[KVCacheSpec]) -> KVCacheSpec:
    """The base itself, a one-field change of it, a promoted-window twin, or another kind."""
    choice = draw(st.sampled_from(["same", "field", "field", "window", "sibling", "other"]))
    if choice == "same":
        return base
    if choice == "field":
        name = draw(st.sampled_from(compared_field_names(base)))
        try:
            return altered(base, name)
        except KVCacheSpecError:  # e.g. a chunk size next to a window: invalid
            return base
    if choice == "window" and isinstance(base, FullAttentionSpec):
        window = draw(st.sampled_from([None, 64, 128]))
        return dataclasses.replace(base, sliding_window=window, attention_chunk_size=None)
    if choice == "sibling":
        return sibling(base)
    return draw(st.sampled_from(pool))


def sibling(spec: KVCacheSpec) -> KVCacheSpec:
    """A spec of a related kind: SW <-> SW-MLA, full <-> MLA / sink, same block size."""
    bs = spec.block_size
    if isinstance(spec, SlidingWindowMLASpec):
        return SlidingWindowSpec(
            block_size=bs, num_kv_heads=1, head_size=64, sliding_window=spec.sliding_window
        )
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowMLASpec(
            block_size=bs, head_size=576, sliding_window=spec.sliding_window
        )
    if isinstance(spec, MLAAttentionSpec | SinkFullAttentionSpec):
        return FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64)
    if isinstance(spec, FullAttentionSpec):
        return MLAAttentionSpec(block_size=bs, head_size=576)
    return spec


@st.composite
def collections(draw: st.DrawFn) -> list[KVCacheSpec]:
    base = draw(base_specs())
    pool = [draw(base_specs()) for _ in range(3)]
    others = draw(st.lists(variant(base, pool), min_size=0, max_size=4))
    return [base, *others]


def as_layers(specs: list[KVCacheSpec]) -> dict[str, KVCacheSpec]:
    return {f"model.layers.{i}.attn": spec for i, spec in enumerate(specs)}


def try_merge(specs: list[KVCacheSpec]) -> KVCacheSpec | None:
    try:
        return type(specs[0]).merge(specs)
    except KVCacheSpecError:
        return None


@pytest.fixture(autouse=True)
def _test_registry() -> Any:
    with isolated(builtins=False):
        register_test_managers()
        yield


@SETTINGS
@given(collections())
@pytest.mark.slow
def test_mergeable_layers_are_uniform(specs: list[KVCacheSpec]) -> None:
    merged = try_merge(specs)
    coll = as_layers(specs)
    uniform = UniformTypeKVCacheSpecs.is_uniform_type(coll)
    if merged is not None:
        # Layers one merged spec can stand for can always share a uniform-type group.
        assert uniform
        assert all(spec.is_uniform_with_collection(coll) for spec in specs)
        assert merged.is_uniform_with_collection(coll)
        assert UniformTypeKVCacheSpecs.is_uniform_type({**coll, "merged": merged})
        assert all(spec.page_size_bytes == merged.page_size_bytes for spec in specs)
        assert all(spec.block_size == merged.block_size for spec in specs)
        assert type(merged) is type(specs[0])
    if not uniform:
        assert merged is None


@st.composite
def one_field_apart(draw: st.DrawFn) -> list[KVCacheSpec]:
    """A spec and a copy differing in one compared field, in either order."""
    base = draw(base_specs())
    name = draw(st.sampled_from(compared_field_names(base)))
    try:
        other = altered(base, name)
    except KVCacheSpecError:
        other = base
    pair = [base, other]
    return pair if draw(st.booleans()) else pair[::-1]


@SETTINGS
@given(one_field_apart())
@pytest.mark.slow
def test_one_field_apart_merge_implies_uniform(specs: list[KVCacheSpec]) -> None:
    test_mergeable_layers_are_uniform.hypothesis.inner_test(specs)  # type: ignore[attr-defined]


@SETTINGS
@given(collections(), st.randoms(use_true_random=False))
@pytest.mark.slow
def test_neither_depends_on_order(specs: list[KVCacheSpec], rnd: Any) -> None:
    shuffled = list(specs)
    rnd.shuffle(shuffled)
    assert UniformTypeKVCacheSpecs.is_uniform_type(
        as_layers(specs)
    ) == UniformTypeKVCacheSpecs.is_uniform_type(as_layers(shuffled))
    merged, merged_shuffled = try_merge(specs), try_merge(shuffled)
    assert (merged is None) == (merged_shuffled is None)
    assert merged == merged_shuffled


@SETTINGS
@given(base_specs())
@pytest.mark.slow
def test_merge_is_idempotent(spec: KVCacheSpec) -> None:
    merged = type(spec).merge([spec])
    assert merged == spec
    assert type(spec).merge([merged, spec]) == spec
