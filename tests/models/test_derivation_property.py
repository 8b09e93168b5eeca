"""The JSON-only derivations agree with transformers' on random configs of each family."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv.models import describe_model, get_kv_cache_specs
from pagedkv.models.source import normalize_with_transformers

pytest.importorskip("transformers")

BASE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


FAMILIES = ["gemma2", "gemma3", "cohere2", "qwen2", "qwen3_next", "gpt_oss", "llama4"]


def family_config(draw: st.DrawFn) -> dict[str, Any]:
    layers = draw(st.integers(1, 40))
    window = draw(st.sampled_from([64, 128, 1024]))
    family = draw(st.sampled_from(FAMILIES))
    cfg: dict[str, Any] = {**BASE, "num_hidden_layers": layers}
    if family == "gemma2":
        cfg.update(architectures=["Gemma2ForCausalLM"], model_type="gemma2", sliding_window=window)
    elif family == "gemma3":
        cfg.update(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text")
        cfg.update(sliding_window=window, sliding_window_pattern=draw(st.integers(2, 8)))
    elif family == "cohere2":
        cfg.update(architectures=["Cohere2ForCausalLM"], model_type="cohere2")
        cfg.update(sliding_window=window, sliding_window_pattern=draw(st.integers(2, 8)))
    elif family == "qwen2":
        cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", sliding_window=window)
        cfg.update(use_sliding_window=draw(st.booleans()))
        cfg.update(max_window_layers=draw(st.integers(0, layers)))
    elif family == "qwen3_next":
        cfg.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next")
        cfg.update(full_attention_interval=draw(st.integers(1, 6)), linear_conv_kernel_dim=4)
        cfg.update(linear_key_head_dim=32, linear_value_head_dim=32)
        cfg.update(linear_num_key_heads=4, linear_num_value_heads=8)
        cfg.update(num_experts=4, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    elif family == "gpt_oss":
        cfg.update(architectures=["GptOssForCausalLM"], model_type="gpt_oss", sliding_window=window)
        cfg.update(num_local_experts=4)
    else:
        cfg.update(architectures=["Llama4ForCausalLM"], model_type="llama4_text")
        cfg.update(attention_chunk_size=window, num_local_experts=4)
    return cfg


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cfg=st.composite(family_config)())
@pytest.mark.slow
def test_json_and_transformers_agree(cfg: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    # transformers really builds the config (else both paths would be the JSON one)
    assert normalize_with_transformers("m", cfg, True)[1] is not None
    plain = get_kv_cache_specs(describe_model(path, use_transformers=False))
    normalised = get_kv_cache_specs(describe_model(path, use_transformers=True))
    assert plain == normalised
    assert len(plain[0]) == cfg["num_hidden_layers"]
