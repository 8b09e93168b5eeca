"""Page sizes, memory per request and block-table rows, with the reference's worked numbers."""

from __future__ import annotations

import pytest

from pagedkv.config import EngineConfig
from pagedkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def llama_layer(**changes: object) -> FullAttentionSpec:
    fields: dict[str, object] = {
        "block_size": 16,
        "num_kv_heads": 8,
        "head_size": 128,
        "dtype": "bfloat16",
    }
    fields.update(changes)
    return FullAttentionSpec(**fields)  # type: ignore[arg-type]


def test_llama_3_1_8b_page_is_64_kib() -> None:
    spec = llama_layer()
    assert spec.page_size_bytes == 64 * KiB == 65_536
    assert spec.real_page_size_bytes == spec.page_size_bytes
    assert spec.padding_bytes == 0
    assert spec.bytes_per_token == 4_096
    # 32 layers: 2 MiB per block id, 128 KiB per token across all layers.
    assert 32 * spec.page_size_bytes == 2 * MiB


def test_llama_memory_per_request() -> None:
    spec = llama_layer()
    config = EngineConfig.create(max_model_len=131_072)
    assert spec.max_num_blocks_per_req(config) == 8_192
    assert spec.max_memory_usage_blocks(config) == 8_192
    assert 32 * spec.max_memory_usage_bytes(config) == 16 * GiB
    # A partial last block is a whole block.
    assert spec.max_num_blocks_per_req(config, max_model_len=17) == 2
    assert spec.max_memory_usage_bytes(config.replace(max_model_len=17)) == 2 * 64 * KiB


def test_llama_variants_fp8_and_tp2() -> None:
    assert llama_layer(dtype="fp8").page_size_bytes == 32 * KiB
    assert llama_layer(num_kv_heads=4).page_size_bytes == 32 * KiB


def test_mla_latent_576_page() -> None:
    spec = MLAAttentionSpec(block_size=64, head_size=576, dtype="bf16")
    assert spec.num_kv_heads == 1
    assert spec.head_size_v == 0  # no separate V
    assert spec.page_size_bytes == 73_728
    assert 61 * spec.page_size_bytes == 4_497_408


def test_mla_packed_format_by_state_content_bytes() -> None:
    # fp8_ds_mla: an opaque 656 B per token.
    spec = MLAAttentionSpec(block_size=64, head_size=576, dtype="uint8", state_content_bytes=656)
    assert spec.page_size_bytes == 41_984


@pytest.mark.parametrize(
    ("dtype", "bytes_per_token"),
    [
        ("bfloat16", 4_096),
        ("float32", 8_192),
        ("fp8", 2_048),  # per-tensor scales live outside the page
        ("fp8_e5m2", 2_048),
        ("int8_per_token_head", 2_112),  # 8 x (256 + 2 x 4-byte scales)
        ("fp8_per_token_head", 2_112),
        ("int4_per_token_head", 1_088),  # 8 x (128 + 8)
        ("nvfp4", 1_152),  # 2 x 8 x (64 + 8)
    ],
)
def test_quantized_formats_count_their_scales(dtype: str, bytes_per_token: int) -> None:
    spec = llama_layer(dtype=dtype)
    assert spec.bytes_per_token == bytes_per_token
    assert spec.page_size_bytes == 16 * bytes_per_token


def test_different_v_head_size() -> None:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=192, head_size_v=128)
    assert spec.page_size_bytes == 16 * 2 * (192 + 128) * 2


def test_padded_page() -> None:
    spec = llama_layer(page_size_padded=80 * KiB)
    assert spec.page_size_bytes == 80 * KiB
    assert spec.real_page_size_bytes == 64 * KiB
    assert spec.padding_bytes == 16 * KiB


def test_copy_with_new_block_size_scales_page_and_padding() -> None:
    spec = llama_layer(page_size_padded=80 * KiB)
    bigger = spec.copy_with_new_block_size(32)
    assert bigger.block_size == 32
    assert bigger.real_page_size_bytes == 128 * KiB
    assert bigger.page_size_bytes == 160 * KiB
    assert spec.block_size == 16  # the original is unchanged
    assert llama_layer().copy_with_new_block_size(64).page_size_bytes == 256 * KiB


def test_sliding_window_admission_blocks_gemma_numbers() -> None:
    spec = SlidingWindowSpec(block_size=16, num_kv_heads=16, head_size=128, sliding_window=1024)
    assert spec.page_size_bytes == 128 * KiB
    assert spec.max_admission_blocks_per_request(16_384, 131_072) == 1_089
    assert spec.max_admission_blocks_per_request(2_048, 131_072) == 193
    # Never more than the whole request (+1 for a window starting mid-block).
    assert spec.max_admission_blocks_per_request(16_384, 100) == 7 + 1


def test_sliding_window_memory_uses_in_flight_tokens() -> None:
    spec = SlidingWindowSpec(block_size=16, num_kv_heads=16, head_size=128, sliding_window=1024)
    config = EngineConfig.create(
        max_model_len=131_072, max_num_batched_tokens=8_192, async_scheduling=True
    )
    assert config.max_in_flight_tokens == 16_384
    assert spec.max_memory_usage_bytes(config) == 1_089 * 128 * KiB
    assert spec.max_memory_usage_blocks(config) == 1_089
    # The block-table row still spans the whole request.
    assert spec.max_num_blocks_per_req(config) == 8_192


def test_sliding_window_extra_retained_tokens() -> None:
    spec = SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=64, sliding_window=32, extra_retained_tokens=2
    )
    assert spec.num_retained_tokens == 33
    assert spec.max_admission_blocks_per_request(0, 10_000) == 3 + 1


def test_sliding_window_mla() -> None:
    spec = SlidingWindowMLASpec(block_size=64, head_size=576, sliding_window=128)
    assert spec.page_size_bytes == 73_728
    assert spec.max_admission_blocks_per_request(64, 10_000) == 3 + 1


def test_chunked_local_admission_has_no_extra_block() -> None:
    spec = ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, attention_chunk_size=8_192
    )
    assert spec.max_admission_blocks_per_request(2_048, 131_072) == 640
    assert spec.max_admission_blocks_per_request(2_048, 1_000) == 63
    config = EngineConfig.create(max_model_len=131_072, max_num_batched_tokens=2_048)
    assert spec.max_memory_usage_bytes(config) == 640 * 64 * KiB


def test_jamba_mamba1_state_size() -> None:
    spec = MambaSpec(block_size=80, shapes=((8192, 3), (8192, 16)), dtypes=("bfloat16", "bfloat16"))
    assert spec.real_page_size_bytes == 311_296
    assert spec.page_size_bytes == 311_296
    fp32_ssm = MambaSpec(block_size=80, shapes=((8192, 3), (8192, 16)), dtypes=("bf16", "fp32"))
    assert fp32_ssm.page_size_bytes == 573_440


def test_mamba_state_does_not_scale_with_block_size() -> None:
    spec = MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("float32",))
    assert spec.copy_with_new_block_size(4096).page_size_bytes == spec.page_size_bytes == 64


def test_mamba_padded_page() -> None:
    spec = MambaSpec(
        block_size=80,
        shapes=((8192, 3), (8192, 16)),
        dtypes=("bf16", "bf16"),
        page_size_padded=327_680,
    )
    assert spec.page_size_bytes == 327_680
    assert spec.padding_bytes == 16_384


@pytest.mark.parametrize(
    ("mode", "spec_blocks", "blocks_per_req", "pages"),
    [("none", 0, 1, 1), ("none", 2, 3, 3), ("align", 0, 3277, 2), ("align", 1, 3278, 3)],
)
def test_mamba_blocks_and_memory(
    mode: str, spec_blocks: int, blocks_per_req: int, pages: int
) -> None:
    spec = MambaSpec(
        block_size=80,
        shapes=((8192, 3), (8192, 16)),
        dtypes=("bf16", "bf16"),
        mamba_cache_mode=mode,  # type: ignore[arg-type]
        num_speculative_blocks=spec_blocks,
    )
    config = EngineConfig.create(max_model_len=262_144)
    assert spec.max_num_blocks_per_req(config) == blocks_per_req
    assert spec.max_memory_usage_bytes(config) == pages * 311_296
    assert spec.prefix_cacheable == (mode == "align")


def test_cross_attention_sized_by_encoder_tokens() -> None:
    spec = CrossAttentionSpec(block_size=16, num_kv_heads=20, head_size=64, dtype="fp16")
    config = EngineConfig.create(max_model_len=448, max_num_encoder_input_tokens=1_500)
    assert spec.max_num_blocks_per_req(config) == 94
    assert spec.max_memory_usage_bytes(config) == 94 * 16 * 20 * 128 * 2
    assert not spec.prefix_cacheable


def test_encoder_only_needs_no_memory() -> None:
    spec = EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=8, head_size=64)
    assert spec.max_memory_usage_bytes(EngineConfig()) == 0
    assert not spec.prefix_cacheable


def test_sink_sizes_like_full_attention() -> None:
    spec = SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, sink_len=16)
    config = EngineConfig.create(max_model_len=1_000)
    assert spec.page_size_bytes == 64 * KiB
    assert spec.max_memory_usage_bytes(config) == llama_layer().max_memory_usage_bytes(config)


def test_bare_attention_spec_has_no_lifetime() -> None:
    spec = AttentionSpec(block_size=16, num_kv_heads=8, head_size=128)
    assert spec.page_size_bytes == 64 * KiB
    with pytest.raises(NotImplementedError, match="AttentionSpec"):
        spec.max_memory_usage_bytes(EngineConfig())


def test_prefix_cacheable_defaults() -> None:
    assert llama_layer().prefix_cacheable
    assert SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=8, sliding_window=4
    ).prefix_cacheable


def test_kinds() -> None:
    kinds = {
        FullAttentionSpec: "full_attention",
        MLAAttentionSpec: "mla_attention",
        SinkFullAttentionSpec: "sink_full_attention",
        SlidingWindowSpec: "sliding_window",
        SlidingWindowMLASpec: "sliding_window_mla",
        ChunkedLocalAttentionSpec: "chunked_local_attention",
        MambaSpec: "mamba",
        CrossAttentionSpec: "cross_attention",
        EncoderOnlyAttentionSpec: "encoder_only_attention",
    }
    for cls, kind in kinds.items():
        assert cls.kind == kind
