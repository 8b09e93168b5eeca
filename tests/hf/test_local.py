"""Local-attention models through pagedkv, token-identical to ``generate()``: Gemma-2
(sliding + global, logit soft-capping), Gemma-3 (5 sliding : 1 global), Gemma-4 (5
sliding : 1 global, global layers with twice the head size and fewer KV heads), Mistral (every
layer sliding), gpt-oss (sliding + global with attention sinks, MoE) and Llama-4
(chunked local attention on RoPE layers, global NoPE layers, MoE).

Windows and chunks are shrunk to 32 tokens (the real ones are 4096 / 1024 / 128 / 8192)
so 80-token requests move past them; the rest of the layer pattern is the real config's.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.hf.harness import Case, assert_continuous_batching, generator, run, tiny

WINDOW = (("sliding_window", 32),)
CASES = {
    "gemma2": Case("gemma-2-9b-it", WINDOW, num_blocks=12),
    "gemma3": Case("gemma-3-27b-it", WINDOW, num_blocks=32),
    "gemma4": Case("gemma-4-26B-A4B", WINDOW, num_blocks=32),
    "mistral": Case("Mistral-7B-v0.1", WINDOW, num_blocks=6),
    "gpt-oss": Case("gpt-oss-20b", WINDOW, num_blocks=12),
    "llama4": Case(
        "Llama-4-Scout-17B-16E-Instruct-TRIMMED", (("attention_chunk_size", 32),), num_blocks=20
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_token_identical_with_hits_preemption_and_window_frees(name: str) -> None:
    case = CASES[name]
    output = run(case)
    assert_continuous_batching(case, output)
    assert output.figures.num_window_null_blocks >= 1  # blocks behind the window were freed


def test_the_tiny_configs_keep_their_layer_patterns() -> None:
    gemma3 = tiny(CASES["gemma3"]).config
    assert gemma3.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    gpt_oss = tiny(CASES["gpt-oss"]).config
    assert gpt_oss.layer_types == ["sliding_attention", "full_attention"]
    assert tiny(CASES["gemma2"]).config.attn_logit_softcapping == 50.0
    gemma4 = generator(CASES["gemma4"]).specs
    sliding, full = gemma4["model.layers.0.self_attn"], gemma4["model.layers.5.self_attn"]
    assert (sliding.head_size, full.head_size) == (16, 32)  # real: 256 and 512
    assert (sliding.num_kv_heads, full.num_kv_heads) == (2, 1)  # real: 8 and 2
    llama4 = tiny(CASES["llama4"]).config
    assert llama4.no_rope_layers == [1, 1, 1, 0]  # three chunked RoPE layers, one global
