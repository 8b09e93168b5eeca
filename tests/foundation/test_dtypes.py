from __future__ import annotations

import pytest

from pagedkv.dtypes import (
    DTYPES,
    KVCacheDtype,
    canonical_dtype_name,
    dtype_size,
    get_kv_dtype,
    known_dtype_names,
)
from pagedkv.errors import ConfigError, UnknownDtypeError


@pytest.mark.parametrize(
    ("name", "canonical", "bits"),
    [
        ("bfloat16", "bfloat16", 16),
        ("bf16", "bfloat16", 16),
        ("float16", "float16", 16),
        ("half", "float16", 16),
        ("fp16", "float16", 16),
        ("float32", "float32", 32),
        ("fp8", "fp8_e4m3", 8),
        ("fp8_e4m3", "fp8_e4m3", 8),
        ("fp8_e5m2", "fp8_e5m2", 8),
        ("int8", "int8", 8),
        ("int4_per_token_head", "int4_per_token_head", 4),
        ("nvfp4", "nvfp4", 4),
        ("  BF16 ", "bfloat16", 16),
        ("torch.float16", "float16", 16),
    ],
)
def test_names_and_aliases(name: str, canonical: str, bits: int) -> None:
    assert canonical_dtype_name(name) == canonical
    assert get_kv_dtype(name).bits == bits


def test_unknown_dtype_lists_known_names() -> None:
    with pytest.raises(UnknownDtypeError) as info:
        get_kv_dtype("float12")
    message = str(info.value)
    assert "'float12'" in message
    for name in ("bfloat16", "fp8_e4m3", "int8", "nvfp4", "bf16"):
        assert name in message
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)


def test_known_names_cover_every_format_and_alias() -> None:
    names = known_dtype_names()
    assert set(DTYPES) <= set(names)
    assert all(canonical_dtype_name(n) in DTYPES for n in names)


@pytest.mark.parametrize(
    ("name", "num_elements", "expected"),
    [
        ("bfloat16", 128, 256),
        ("float32", 128, 512),
        ("fp8", 128, 128),  # per-tensor scale: not in the page
        ("int8", 128, 128),
        ("int8_per_token_head", 128, 128 + 4),  # one fp32 scale per vector
        ("fp8_per_token_head", 128, 128 + 4),
        ("int4_per_token_head", 128, 64 + 4),
        ("nvfp4", 128, 64 + 8),  # one 1-byte scale per 16 elements
        ("nvfp4", 20, 10 + 2),  # a partial scale group still needs its scale
        ("int4_per_token_head", 3, 2 + 4),  # half bytes round up
        ("nvfp4", 0, 0),
    ],
)
def test_bytes_per_vector_counts_scales(name: str, num_elements: int, expected: int) -> None:
    assert get_kv_dtype(name).bytes_per_vector(num_elements) == expected


def test_dtype_size_whole_bytes_only() -> None:
    assert dtype_size("bf16") == 2
    assert dtype_size("float32") == 4
    assert dtype_size("int8") == 1
    with pytest.raises(UnknownDtypeError, match="int4_per_token_head"):
        dtype_size("int4_per_token_head")
    with pytest.raises(UnknownDtypeError, match="int8_per_token_head"):
        dtype_size("int8_per_token_head")


def test_format_is_frozen() -> None:
    fmt = KVCacheDtype("x", 8)
    with pytest.raises(AttributeError):
        fmt.bits = 4  # type: ignore[misc]


def test_torch_dtypes_accepted() -> None:
    torch = pytest.importorskip("torch")
    assert canonical_dtype_name(torch.bfloat16) == "bfloat16"
    assert canonical_dtype_name(torch.half) == "float16"
    assert canonical_dtype_name(torch.float32) == "float32"
    assert canonical_dtype_name(torch.float8_e4m3fn) == "fp8_e4m3"
    assert canonical_dtype_name(torch.float8_e5m2) == "fp8_e5m2"
    assert canonical_dtype_name(torch.int8) == "int8"
    assert canonical_dtype_name(torch.uint8) == "uint8"
    with pytest.raises(UnknownDtypeError, match="complex64"):
        canonical_dtype_name(torch.complex64)
