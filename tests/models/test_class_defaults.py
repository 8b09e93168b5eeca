"""Published configs read as transformers reads them: fields left out take the class
defaults of the config's model type, and the plan says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkv.errors import ModelConfigError
from pagedkv.models import describe_model, get_kv_cache_specs, load_model_config
from pagedkv.models.class_defaults import (
    CLASS_DEFAULTS,
    MODEL_TYPE_ALIASES,
    TEXT_MODEL_TYPES,
    class_defaults,
    transformers_class_defaults,
)
from pagedkv.specs import FullAttentionSpec, SlidingWindowSpec


def test_the_table_agrees_with_transformers_classes() -> None:
    pytest.importorskip("transformers")
    for model_type, table in CLASS_DEFAULTS.items():
        assert transformers_class_defaults(model_type) == table, model_type


def test_wrapper_and_alias_types_resolve_to_a_table_entry() -> None:
    for text_type in TEXT_MODEL_TYPES.values():
        assert text_type in CLASS_DEFAULTS
    for target in MODEL_TYPE_ALIASES.values():
        assert target in CLASS_DEFAULTS
    kimi = class_defaults("kimi_k2", use_transformers=False)
    assert kimi is not None and kimi.model_type == "deepseek_v3"


def test_published_gemma_3_27b_it_plans_with_its_class_defaults() -> None:
    source = load_model_config("gemma-3-27b-it")
    assert "vocab_size" not in source.text_config  # the published file leaves it out
    layout = describe_model("gemma-3-27b-it")
    filled = dict(layout.filled_fields)
    assert filled == {"vocab_size": 262208, "max_position_embeddings": 131072}
    assert layout.defaults_from is not None and "gemma3_text" in layout.defaults_from
    assert layout.embedding_params == 262208 * 5376
    assert layout.max_model_len == 131072
    kinds = layout.layer_kinds()
    assert kinds == {"sliding_window": 52, "full_attention": 10}


def test_transformers_and_the_table_give_the_same_layout() -> None:
    pytest.importorskip("transformers")
    with_table = describe_model("gemma-3-27b-it", use_transformers=False)
    with_transformers = describe_model("gemma-3-27b-it", use_transformers=True)
    assert with_table.units == with_transformers.units
    assert with_table.embedding_params == with_transformers.embedding_params
    assert with_table.max_model_len == with_transformers.max_model_len


def _write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def test_a_missing_field_takes_the_class_default(tmp_path: Path) -> None:
    (specs,) = get_kv_cache_specs(_write(tmp_path, MISTRAL), use_transformers=False)
    spec = specs["model.layers.0.self_attn"]
    assert isinstance(spec, SlidingWindowSpec) and spec.sliding_window == 4096
    filled = dict(describe_model(_write(tmp_path, MISTRAL), use_transformers=False).filled_fields)
    assert filled["sliding_window"] == 4096
    assert filled["max_position_embeddings"] == 131072


def test_a_published_null_is_not_replaced_by_the_default(tmp_path: Path) -> None:
    path = _write(tmp_path, {**MISTRAL, "sliding_window": None})
    (specs,) = get_kv_cache_specs(path, use_transformers=False)
    assert type(specs["model.layers.0.self_attn"]) is FullAttentionSpec


def test_unknown_model_type_refuses_the_missing_field_naming_it_and_the_file(
    tmp_path: Path,
) -> None:
    data = {k: v for k, v in MISTRAL.items() if k != "vocab_size"}
    data["model_type"] = "mistral_fork"
    path = _write(tmp_path, data)
    with pytest.raises(ModelConfigError) as info:
        describe_model(path, use_transformers=False)
    message = str(info.value)
    assert "'vocab_size' is missing" in message and str(path) in message
    assert "no known class defaults" in message


def test_minimax_m2_plans_full_attention_on_every_layer() -> None:
    # vLLM's MiniMax-M2 builds plain attention on every layer (attn_type_list is not read)
    layout = describe_model("MiniMax-M2.7")
    assert layout.layer_kinds() == {"full_attention": 62}
