"""Long-RoPE and dynamic NTK RoPE under packing and chunked prefill.

transformers chooses these models' frequencies from the largest position in the pass,
so a token's rotation would depend on what else is packed with it. pagedkv fixes them
by vLLM's rule (long factors when max_model_len exceeds the original positions; dynamic
NTK scaled for the configured over the trained positions) and the reference
``generate()`` applies the same rule.
Configs: Phi-3-style long-RoPE and Qwen2-style dynamic NTK, written here (no Hub).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.hf.harness import Case, prompts_for

from pagedkv.hf import PagedGenerator
from pagedkv.hf.reference import first_mismatch, reference_tokens
from pagedkv.hf.rope import fixed_rope
from pagedkv.hf.tiny import seeded_model

ORIGINAL_POSITIONS = 64
CASE = Case("rope", prefix_tokens=72, num_blocks=14, max_new_tokens=8)


def _common() -> dict[str, Any]:
    return {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }


@functools.cache
def phi3_longrope() -> Any:
    from transformers import Phi3Config

    half = 8  # head size 16
    config = Phi3Config(
        **_common(),
        original_max_position_embeddings=ORIGINAL_POSITIONS,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * half,
            "long_factor": [1.0 + 4 * i for i in range(half)],
            "original_max_position_embeddings": ORIGINAL_POSITIONS,
        },
        pad_token_id=0,
    )
    return seeded_model(config)


@functools.cache
def qwen2_dynamic() -> Any:
    from transformers import Qwen2Config

    config = Qwen2Config(
        **_common(),
        rope_parameters={
            "rope_type": "dynamic",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "max_trained_positions": 128,
        },
    )
    return seeded_model(config)


def _run(model: Any) -> tuple[PagedGenerator, Any]:
    gen = PagedGenerator(
        model, num_blocks=CASE.num_blocks, max_num_batched_tokens=32, max_num_seqs=4
    )
    return gen, gen.generate(prompts_for(CASE), CASE.max_new_tokens, arrivals_per_step=1)


@pytest.mark.parametrize("make", [phi3_longrope, qwen2_dynamic], ids=["longrope", "dynamic"])
def test_token_identical_to_generate_under_the_same_rule(make: Any) -> None:
    model = make()
    gen, output = _run(model)
    rule = gen.rope_rule()
    assert rule is not None and rule.rope_type in ("longrope", "dynamic")
    mismatch = first_mismatch(model, prompts_for(CASE), output.token_ids, CASE.max_new_tokens, rule)
    assert mismatch is None, mismatch.describe()
    figures = output.figures
    assert figures.num_hit_tokens >= 32 and figures.max_requests_per_step >= 2
    assert model.model.rotary_emb.rope_type == rule.rope_type  # given back after the run


def test_longrope_rule_is_vllms_and_changes_the_tokens() -> None:
    model = phi3_longrope()
    gen, _ = _run(model)
    rule = gen.rope_rule()
    assert rule is not None and rule.use_long_factors  # max_model_len 256 > 64
    prompt = prompts_for(CASE)[0][:40]  # shorter than the original positions
    with fixed_rope(model, rule):
        long_tokens = reference_tokens(model, prompt, 8)
    # transformers alone uses the short factors below 64 positions: the rule matters
    assert long_tokens != reference_tokens(model, prompt, 8)
    assert "long factors" in rule.describe()
