"""Every bundled config, derived to specs, against the model's published numbers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pagedkv.models import describe_model, get_kv_cache_specs, list_bundled_models
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

F, SW, CH, MLA = FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec
SINK, CROSS, MAMBA = SinkFullAttentionSpec, CrossAttentionSpec, MambaSpec

Expectation = tuple[type, int, dict[str, Any]]


def att(cls: type, count: int, kv_heads: int, head: int, **extra: Any) -> Expectation:
    return cls, count, {"num_kv_heads": kv_heads, "head_size": head, **extra}


def mamba(count: int, conv: tuple[int, int], ssm: tuple[int, ...], **extra: Any) -> Expectation:
    return MAMBA, count, {"shapes": (conv, ssm), **extra}


MIXED = ("bfloat16", "float32")
# name -> expectations (spec class, layer count, fields every such layer has), TP 1.
EXPECTED: dict[str, list[Expectation]] = {
    "bart-large": [att(F, 12, 16, 64), att(CROSS, 12, 16, 64)],
    "c4ai-command-r7b-12-2024": [
        att(SW, 24, 8, 128, sliding_window=4096),
        att(F, 8, 8, 128),
    ],
    "DeepSeek-V2-Lite": [att(MLA, 27, 1, 576, max_tp_shards=1)],
    "DeepSeek-V3": [att(MLA, 61, 1, 512 + 64, max_tp_shards=1)],
    "DeepSeek-V3.2": [
        att(MLA, 61, 1, 576, dtype="bfloat16"),
        att(MLA, 61, 1, 128 + 4, dtype="uint8"),  # the DSA indexer key, as GLM-5's
    ],
    "gemma-2-9b-it": [att(SW, 21, 8, 256, sliding_window=4096), att(F, 21, 8, 256)],
    "gemma-3-27b-it": [att(SW, 52, 16, 128, sliding_window=1024), att(F, 10, 16, 128)],
    "gemma-4-26B-A4B": [att(SW, 25, 8, 256, sliding_window=1024), att(F, 5, 2, 512)],
    "GLM-5": [
        att(MLA, 78, 1, 576, dtype="bfloat16"),
        att(MLA, 78, 1, 128 + 4, dtype="uint8"),  # sparse-attention indexer: fp8 + scale
    ],
    # vLLM's Attention gives the sink layers a plain FullAttentionSpec
    "gpt-oss-20b": [att(SW, 12, 8, 64, sliding_window=128), att(F, 12, 8, 64)],
    "granite-4.0-h-350m": [att(F, 4, 4, 64), mamba(28, (1536 + 2 * 128, 3), (48, 32, 128))],
    "Jamba-v0.1": [att(F, 4, 8, 128), mamba(28, (8192, 3), (8192, 16), mamba_type="mamba1")],
    "Kimi-K2-Instruct": [att(MLA, 61, 1, 576)],
    "Llama-3.1-8B": [att(F, 32, 8, 128)],
    "Llama-4-Scout-17B-16E-Instruct-TRIMMED": [
        att(CH, 36, 8, 128, attention_chunk_size=8192),
        att(F, 12, 8, 128),
    ],
    "mamba2-2.7b": [mamba(64, (5120 + 2 * 128, 3), (80, 64, 128), dtypes=("bfloat16",) * 2)],
    "MiniMax-M2.7": [att(F, 62, 8, 128)],
    "Mistral-7B-v0.1": [att(SW, 32, 8, 128, sliding_window=4096)],
    "Mixtral-8x7B-v0.1": [att(F, 32, 8, 128)],
    "Nemotron-H-56B-Base-8K": [
        att(F, 10, 8, 128),
        mamba(54, (16384 + 2 * 8 * 256, 3), (256, 64, 256)),
    ],
    "Phi-3-mini-4k-instruct": [att(SW, 32, 32, 96, sliding_window=2047)],
    "phi-4": [att(F, 40, 10, 128)],
    "Qwen2.5-7B-Instruct": [att(F, 28, 4, 128)],
    "Qwen3-8B": [att(F, 36, 8, 128)],
    "Qwen3-Next-80B-A3B-Instruct": [
        att(F, 12, 2, 256),
        mamba(36, (2 * 16 * 128 + 32 * 128, 3), (32, 128, 128)),
    ],
    "Qwen3.5-27B": [
        att(F, 16, 4, 256),
        mamba(48, (2 * 16 * 128 + 48 * 128, 3), (48, 128, 128), dtypes=MIXED),
    ],
    "Qwen3.5-35B-A3B": [
        att(F, 10, 2, 256),
        mamba(30, (2 * 16 * 128 + 32 * 128, 3), (32, 128, 128), dtypes=MIXED),
    ],
    "t5-small": [att(F, 6, 8, 64), att(CROSS, 6, 8, 64)],
    "whisper-large-v3": [att(F, 32, 20, 64, dtype="float16"), att(CROSS, 32, 20, 64)],
}

PATHS = [pytest.param(False, id="json"), pytest.param(True, id="transformers")]


def _skip_without_transformers(use_transformers: bool) -> None:
    if use_transformers:
        pytest.importorskip("transformers")


def _matches(spec: KVCacheSpec, cls: type, fields: dict[str, Any]) -> bool:
    return type(spec) is cls and all(getattr(spec, k) == v for k, v in fields.items())


def test_every_bundled_model_has_expectations() -> None:
    assert sorted(list_bundled_models(), key=str.lower) == sorted(EXPECTED, key=str.lower)


@pytest.mark.parametrize("use_transformers", PATHS)
@pytest.mark.parametrize("name", sorted(EXPECTED, key=str.lower))
def test_specs_match_published_numbers(name: str, use_transformers: bool) -> None:
    _skip_without_transformers(use_transformers)
    layout = describe_model(name, use_transformers=use_transformers)
    (specs,) = get_kv_cache_specs(layout)
    unmatched = dict(specs)
    for cls, count, fields in EXPECTED[name]:
        hits = [n for n, s in unmatched.items() if _matches(s, cls, fields)]
        assert len(hits) == count, (cls.__name__, fields, len(hits))
        for hit in hits:
            del unmatched[hit]
    assert not unmatched, f"layers matched by no expectation: {sorted(unmatched)[:3]}"


@pytest.mark.parametrize("name", sorted(EXPECTED, key=str.lower))
def test_json_and_transformers_paths_agree(name: str) -> None:
    pytest.importorskip("transformers")
    plain = get_kv_cache_specs(describe_model(name, use_transformers=False))
    normalised = get_kv_cache_specs(describe_model(name, use_transformers=True))
    assert plain == normalised


def test_layer_positions_follow_the_published_patterns() -> None:
    def kinds(name: str) -> list[str]:
        layout = describe_model(name, use_transformers=False)
        return [type(s).__name__ for s in get_kv_cache_specs(layout)[0].values()]

    gemma3 = kinds("gemma-3-27b-it")
    assert [i for i, k in enumerate(gemma3) if k == "FullAttentionSpec"] == list(range(5, 62, 6))
    llama4 = kinds("Llama-4-Scout-17B-16E-Instruct-TRIMMED")
    assert [i for i, k in enumerate(llama4) if k == "FullAttentionSpec"] == list(range(3, 48, 4))
    jamba = kinds("Jamba-v0.1")
    assert [i for i, k in enumerate(jamba) if k == "FullAttentionSpec"] == [4, 12, 20, 28]
    granite = kinds("granite-4.0-h-350m")
    assert [i for i, k in enumerate(granite) if k == "FullAttentionSpec"] == [10, 13, 17, 27]
    gemma2 = kinds("gemma-2-9b-it")
    assert gemma2[:2] == ["SlidingWindowSpec", "FullAttentionSpec"]


def test_mamba_pages_match_the_reference_example() -> None:
    (specs,) = get_kv_cache_specs("Jamba-v0.1", use_transformers=False)
    mamba = next(s for s in specs.values() if isinstance(s, MambaSpec))
    # 8192 x 3 x 2 B conv + 8192 x 16 x 2 B ssm (reference section 8.3)
    assert mamba.page_size_bytes == 311_296
    assert mamba.padding_bytes == 0
    assert mamba.block_size == 16


def test_layer_kind_counts_are_reported() -> None:
    layout = describe_model("Nemotron-H-56B-Base-8K", use_transformers=False)
    assert layout.layer_kinds() == {"mamba": 54, "full_attention": 10}
    assert len(layout.units) == 118
    assert Counter(len(u.layers) for u in layout.units)[0] == 54  # MLP-only layers


@pytest.mark.parametrize(
    ("name", "mamba_type", "alignment"),
    [
        ("Qwen3.5-27B", "gated_delta_net", 64),  # grid: lcm(block 16, the GDN kernel step 64)
        ("Nemotron-H-56B-Base-8K", "mamba2", 1),
        ("granite-4.0-h-350m", "mamba2", 1),
        ("Jamba-v0.1", "mamba1", None),
    ],
)
def test_state_specs_carry_vllms_prefill_checkpoints(
    name: str, mamba_type: str, alignment: int | None
) -> None:
    """Mamba-2 and gated-DeltaNet layers export prefill checkpoints (vLLM 0.33); Mamba-1
    layers cannot."""
    (specs,) = get_kv_cache_specs(name, use_transformers=False)
    states = [s for s in specs.values() if isinstance(s, MambaSpec)]
    assert states and all(s.mamba_type == mamba_type for s in states)
    assert {(s.num_prefill_checkpoint_blocks, s.prefill_checkpoint_alignment) for s in states} == {
        (0 if alignment is None else 1, alignment)
    }


def test_planned_gated_deltanet_checkpoints_follow_the_block() -> None:
    """The planner grows Mamba blocks to the attention page; a gated-DeltaNet checkpoint
    grid (the block) grows with it."""
    from pagedkv import EngineConfig, plan_kv_cache

    config = EngineConfig.create(max_model_len=8192)
    specs = get_kv_cache_specs("Qwen3.5-27B", config=config, use_transformers=False)
    plan = plan_kv_cache(config, specs, [20 * 2**30])
    states = [g.kv_cache_spec for g in plan.configs[0].kv_cache_groups]
    states = [s for s in states if isinstance(s, MambaSpec)]
    assert states and all(s.block_size > 16 for s in states)
    assert all(s.prefill_checkpoint_alignment == s.block_size for s in states)
