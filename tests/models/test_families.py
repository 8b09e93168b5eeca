"""Families vLLM 0.33 serves, planned with the spec kinds vLLM gives their layers.
GLM-4.5's published config is not bundled (no byte copy was found): its shape is
written here from the model's published architecture."""

from __future__ import annotations

import json
from pathlib import Path

from pagedkv.models import describe_model, get_kv_cache_specs
from pagedkv.specs import FullAttentionSpec, MLAAttentionSpec

GLM_45 = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 92,
    "vocab_size": 151552,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def test_glm_4_5_is_full_attention_with_moe_from_layer_3(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GLM_45))
    layout = describe_model(path, use_transformers=False)
    (specs,) = get_kv_cache_specs(layout)
    assert {type(s) for s in specs.values()} == {FullAttentionSpec}
    assert len(specs) == 92
    spec = specs["model.layers.0.self_attn"]
    assert (spec.num_kv_heads, spec.head_size) == (8, 128)
    assert [u.expert_params > 0 for u in layout.units[:4]] == [False, False, False, True]
    assert 340e9 < layout.num_params < 370e9  # 355B published


def test_deepseek_v3_2_has_mla_and_an_indexer_per_layer() -> None:
    (specs,) = get_kv_cache_specs("DeepSeek-V3.2", use_transformers=False)
    indexers = [s for n, s in specs.items() if n.endswith(".indexer")]
    assert len(indexers) == 61 and all(s.dtype == "uint8" for s in indexers)
    assert all(isinstance(s, MLAAttentionSpec) for s in specs.values())
