"""merge: one spec for a group of layers; it validates every field it does not reconcile."""

from __future__ import annotations

import pytest

from pagedkv.errors import KVCacheSpecError
from pagedkv.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

from .spec_variants import ATTN, MERGEABLE_EXAMPLES, altered, compared_field_names

# Fields a merge reconciles instead of requiring equality.
RECONCILED = {FullAttentionSpec: {"sliding_window", "attention_chunk_size"}}


def reconciled(spec: KVCacheSpec) -> set[str]:
    return next((names for cls, names in RECONCILED.items() if isinstance(spec, cls)), set())


CASES = [
    (spec, name)
    for spec in MERGEABLE_EXAMPLES
    for name in compared_field_names(spec)
    if name not in reconciled(spec)
]


@pytest.mark.parametrize(("spec", "name"), CASES, ids=[f"{type(s).__name__}.{n}" for s, n in CASES])
def test_merge_rejects_every_unreconciled_difference(spec: KVCacheSpec, name: str) -> None:
    other = altered(spec, name)
    assert other != spec
    for specs in ([spec, other], [other, spec], [spec, spec, other]):
        with pytest.raises(KVCacheSpecError) as info:
            type(spec).merge(specs)
        assert repr(name) in str(info.value)
        assert type(spec).__name__ in str(info.value)


@pytest.mark.parametrize("spec", MERGEABLE_EXAMPLES, ids=lambda s: type(s).__name__)
def test_merge_of_equal_specs_is_that_spec(spec: KVCacheSpec) -> None:
    merged = type(spec).merge([spec, spec, spec])
    assert merged == spec
    assert type(merged) is type(spec)


@pytest.mark.parametrize("spec", MERGEABLE_EXAMPLES, ids=lambda s: type(s).__name__)
def test_merge_needs_at_least_one_spec(spec: KVCacheSpec) -> None:
    with pytest.raises(KVCacheSpecError, match="at least one"):
        type(spec).merge([])


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (FullAttentionSpec(**ATTN), MLAAttentionSpec(block_size=16, head_size=576)),
        (FullAttentionSpec(**ATTN), SinkFullAttentionSpec(**ATTN, sink_len=16)),
        (
            SlidingWindowSpec(**ATTN, sliding_window=128),
            SlidingWindowMLASpec(block_size=16, head_size=576, sliding_window=128),
        ),
        (FullAttentionSpec(**ATTN), SlidingWindowSpec(**ATTN, sliding_window=128)),
    ],
)
def test_merge_rejects_different_kinds(first: KVCacheSpec, second: KVCacheSpec) -> None:
    for specs in ([first, second], [second, first]):
        with pytest.raises(KVCacheSpecError, match="cannot merge"):
            type(specs[0]).merge(specs)


def test_merge_rejects_specs_of_another_class_than_the_merging_one() -> None:
    with pytest.raises(KVCacheSpecError, match="cannot merge"):
        MambaSpec.merge([FullAttentionSpec(**ATTN)])


def test_full_attention_merge_keeps_promoted_window() -> None:
    plain = FullAttentionSpec(**ATTN)
    promoted = FullAttentionSpec(**ATTN, sliding_window=1024)
    for specs in ([plain, promoted], [promoted, plain], [promoted, promoted]):
        merged = FullAttentionSpec.merge(specs)
        assert merged.sliding_window == 1024
        assert merged.attention_chunk_size is None
    chunked = FullAttentionSpec(**ATTN, attention_chunk_size=8192)
    assert FullAttentionSpec.merge([plain, chunked]).attention_chunk_size == 8192
    assert FullAttentionSpec.merge([plain, plain]).sliding_window is None


def test_full_attention_merge_rejects_two_windows_or_window_and_chunk() -> None:
    with pytest.raises(KVCacheSpecError, match=r"same window.*\[512, 1024\]"):
        FullAttentionSpec.merge(
            [
                FullAttentionSpec(**ATTN, sliding_window=1024),
                FullAttentionSpec(**ATTN, sliding_window=512),
            ]
        )
    with pytest.raises(KVCacheSpecError, match="sliding-window and chunked-local"):
        FullAttentionSpec.merge(
            [
                FullAttentionSpec(**ATTN, sliding_window=1024),
                FullAttentionSpec(**ATTN, attention_chunk_size=8192),
            ]
        )


def test_subclass_merge_reconciles_windows_and_checks_own_fields() -> None:
    first = SinkFullAttentionSpec(**ATTN, sink_len=16, sliding_window=64)
    second = SinkFullAttentionSpec(**ATTN, sink_len=16)
    merged = SinkFullAttentionSpec.merge([second, first])
    assert isinstance(merged, SinkFullAttentionSpec)
    assert merged.sliding_window == 64
    assert merged.sink_len == 16
    with pytest.raises(KVCacheSpecError, match="'sink_len'"):
        SinkFullAttentionSpec.merge([second, SinkFullAttentionSpec(**ATTN, sink_len=32)])
    mla = MLAAttentionSpec(block_size=16, head_size=576)
    assert MLAAttentionSpec.merge([mla, MLAAttentionSpec(block_size=16, head_size=576)]) == mla


def test_merge_error_lists_the_differing_values() -> None:
    with pytest.raises(KVCacheSpecError, match=r"'num_kv_heads': 8, 4"):
        FullAttentionSpec.merge(
            [FullAttentionSpec(**ATTN), FullAttentionSpec(**{**ATTN, "num_kv_heads": 4})]
        )
