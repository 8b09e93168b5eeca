"""Spec construction: validation errors, frozen / hashable / keyword-only, dtypes."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.errors import KVCacheSpecError, UnknownDtypeError
from pagedkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

ATTN = {"block_size": 16, "num_kv_heads": 8, "head_size": 128}

EXAMPLES: list[KVCacheSpec] = [
    FullAttentionSpec(**ATTN),
    MLAAttentionSpec(block_size=64, head_size=576),
    SinkFullAttentionSpec(**ATTN, sink_len=16),
    SlidingWindowSpec(**ATTN, sliding_window=1024),
    SlidingWindowMLASpec(block_size=64, head_size=576, sliding_window=128),
    ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=8192),
    CrossAttentionSpec(**ATTN),
    EncoderOnlyAttentionSpec(**ATTN),
    MambaSpec(block_size=16, shapes=((4, 3), (4, 8)), dtypes=("bf16", "fp32")),
]


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda s: type(s).__name__)
def test_frozen_hashable_equal_by_value(spec: KVCacheSpec) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.block_size = 32  # type: ignore[misc]
    twin = dataclasses.replace(spec)
    assert twin == spec
    assert hash(twin) == hash(spec)
    assert len({spec, twin}) == 1
    assert spec.copy_with_new_block_size(spec.block_size * 2) != spec


@pytest.mark.parametrize("cls", [type(s) for s in EXAMPLES], ids=lambda c: c.__name__)
def test_keyword_only(cls: type) -> None:
    with pytest.raises(TypeError):
        cls(16)


def test_uniform_type_spec_is_hashable_and_frozen() -> None:
    layers = {"a": FullAttentionSpec(**ATTN), "b": MLAAttentionSpec(block_size=16, head_size=576)}
    group = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs=layers)
    again = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs=dict(layers))
    assert group == again and hash(group) == hash(again)
    with pytest.raises(dataclasses.FrozenInstanceError):
        group.block_size = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        UniformTypeKVCacheSpecs(16)  # type: ignore[misc]


def test_is_draft_is_not_compared() -> None:
    target = FullAttentionSpec(**ATTN)
    draft = FullAttentionSpec(**ATTN, is_draft=True)
    assert draft == target
    assert hash(draft) == hash(target)
    assert FullAttentionSpec.merge([target, draft]) == target


def test_head_size_v_defaults_to_head_size() -> None:
    assert FullAttentionSpec(**ATTN).head_size_v == 128


def test_dtype_is_canonical_name() -> None:
    assert FullAttentionSpec(**ATTN, dtype="bf16") == FullAttentionSpec(**ATTN, dtype="bfloat16")
    assert FullAttentionSpec(**ATTN, dtype="half").dtype == "float16"


def test_torch_dtype_accepted_when_installed() -> None:
    torch = pytest.importorskip("torch")
    spec = FullAttentionSpec(**ATTN, dtype=torch.bfloat16)
    assert spec.dtype == "bfloat16"
    assert spec == FullAttentionSpec(**ATTN)
    assert FullAttentionSpec(**ATTN, dtype=torch.float8_e4m3fn).page_size_bytes == 32 * 1024
    mamba = MambaSpec(block_size=16, shapes=((4,), (4,)), dtypes=(torch.float16, torch.float32))
    assert mamba.dtypes == ("float16", "float32")
    assert mamba.page_size_bytes == 4 * 2 + 4 * 4


@pytest.mark.parametrize(
    ("cls", "fields", "message"),
    [
        (FullAttentionSpec, {**ATTN, "block_size": 0}, "FullAttentionSpec.block_size"),
        (FullAttentionSpec, {**ATTN, "block_size": 16.0}, "FullAttentionSpec.block_size"),
        (FullAttentionSpec, {**ATTN, "block_size": True}, "FullAttentionSpec.block_size"),
        (FullAttentionSpec, {**ATTN, "num_kv_heads": 0}, "FullAttentionSpec.num_kv_heads"),
        (
            SlidingWindowSpec,
            {**ATTN, "head_size": -1, "sliding_window": 4},
            "SlidingWindowSpec.head_size",
        ),
        (FullAttentionSpec, {**ATTN, "head_size_v": -1}, "FullAttentionSpec.head_size_v"),
        (FullAttentionSpec, {**ATTN, "max_tp_shards": 0}, "FullAttentionSpec.max_tp_shards"),
        (
            FullAttentionSpec,
            {**ATTN, "state_content_bytes": 0},
            "FullAttentionSpec.state_content_bytes",
        ),
        (
            FullAttentionSpec,
            {**ATTN, "page_size_padded": 100},
            "FullAttentionSpec.page_size_padded",
        ),
        (FullAttentionSpec, {**ATTN, "page_size_padded": 0}, "FullAttentionSpec.page_size_padded"),
        (FullAttentionSpec, {**ATTN, "sliding_window": 0}, "FullAttentionSpec.sliding_window"),
        (
            FullAttentionSpec,
            {**ATTN, "sliding_window": 8, "attention_chunk_size": 8},
            "both sliding_window and attention_chunk_size",
        ),
        (SinkFullAttentionSpec, {**ATTN, "sink_len": 0}, "SinkFullAttentionSpec.sink_len"),
        (SlidingWindowSpec, {**ATTN, "sliding_window": 0}, "SlidingWindowSpec.sliding_window"),
        (
            SlidingWindowSpec,
            {**ATTN, "sliding_window": 4, "extra_retained_tokens": -1},
            "SlidingWindowSpec.extra_retained_tokens",
        ),
        (
            SlidingWindowMLASpec,
            {"block_size": 16, "head_size": 8, "sliding_window": -4},
            "SlidingWindowMLASpec.sliding_window",
        ),
        (
            ChunkedLocalAttentionSpec,
            {**ATTN, "attention_chunk_size": 0},
            "ChunkedLocalAttentionSpec.attention_chunk_size",
        ),
        (MambaSpec, {"block_size": 16, "shapes": (), "dtypes": ()}, "MambaSpec.shapes"),
        (
            MambaSpec,
            {"block_size": 16, "shapes": ((0, 4),), "dtypes": ("bf16",)},
            "MambaSpec.shapes",
        ),
        (
            MambaSpec,
            {"block_size": 16, "shapes": ((2.5,),), "dtypes": ("bf16",)},
            "MambaSpec.shapes",
        ),
        (MambaSpec, {"block_size": 16, "shapes": (4, 4), "dtypes": ("bf16",)}, "MambaSpec.shapes"),
        (
            MambaSpec,
            {"block_size": 16, "shapes": ((4,),), "dtypes": ("bf16", "bf16")},
            "MambaSpec.dtypes",
        ),
        (
            MambaSpec,
            {"block_size": 16, "shapes": ((4,),), "dtypes": ("bf16",), "mamba_cache_mode": "all"},
            "MambaSpec.mamba_cache_mode",
        ),
        (
            MambaSpec,
            {
                "block_size": 16,
                "shapes": ((4,),),
                "dtypes": ("bf16",),
                "num_speculative_blocks": -1,
            },
            "MambaSpec.num_speculative_blocks",
        ),
        (
            MambaSpec,
            {"block_size": 16, "shapes": ((4,),), "dtypes": ("bf16",), "page_size_padded": 4},
            "MambaSpec.page_size_padded",
        ),
        (
            MambaSpec,
            {"block_size": 0, "shapes": ((4,),), "dtypes": ("bf16",)},
            "MambaSpec.block_size",
        ),
    ],
)
def test_invalid_fields_name_class_and_field(
    cls: type, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(KVCacheSpecError) as info:
        cls(**fields)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("cls", "fields", "message"),
    [
        (FullAttentionSpec, {**ATTN, "dtype": "float12"}, "FullAttentionSpec.dtype"),
        (CrossAttentionSpec, {**ATTN, "dtype": "auto"}, "CrossAttentionSpec.dtype"),
        (
            MambaSpec,
            {"block_size": 16, "shapes": ((4,),), "dtypes": ("float12",)},
            "MambaSpec.dtypes",
        ),
    ],
)
def test_unknown_dtype_names_class_and_field(
    cls: type, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(UnknownDtypeError) as info:
        cls(**fields)
    assert message in str(info.value)
    assert "bfloat16" in str(info.value)  # lists the known names


def test_subclass_errors_name_the_subclass() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MyMamba(MambaSpec):
        pass

    with pytest.raises(KVCacheSpecError, match=r"MyMamba\.shapes"):
        MyMamba(block_size=16, shapes=((0,),), dtypes=("bf16",))


def test_mamba_normalizes_lists_and_single_dtype() -> None:
    spec = MambaSpec(block_size=16, shapes=[[4, 3]], dtypes="half")  # type: ignore[arg-type]
    assert spec.shapes == ((4, 3),)
    assert spec.dtypes == ("float16",)
    assert hash(spec) == hash(MambaSpec(block_size=16, shapes=((4, 3),), dtypes=("fp16",)))


def test_uniform_type_spec_validation() -> None:
    with pytest.raises(KVCacheSpecError, match="at least one layer"):
        UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={})
    with pytest.raises(KVCacheSpecError, match="block sizes"):
        UniformTypeKVCacheSpecs(
            block_size=16, kv_cache_specs={"a": FullAttentionSpec(**{**ATTN, "block_size": 32})}
        )


def test_attention_spec_is_instantiable_but_abstract_base_is_not() -> None:
    assert AttentionSpec(**ATTN).page_size_bytes == 65_536
    with pytest.raises(TypeError):
        KVCacheSpec(block_size=16)  # type: ignore[abstract]
