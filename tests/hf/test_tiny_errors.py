"""``--tiny`` on transformers-format configs: Mamba-2's ``num_heads``/``head_dim`` and
Falcon-H1's ``mamba_d_ssm`` shrink consistently; what cannot be built is reported with
transformers' reason, and "no causal LM" only where there is none."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoConfig

from pagedkv.errors import ModelConfigError
from pagedkv.hf.tiny import seeded_model, tiny_config


def test_transformers_mamba2_config_shrinks_its_heads() -> None:
    config = AutoConfig.for_model("mamba2")
    tiny = tiny_config(config, vocab_size=64)
    assert tiny.head_dim == config.head_dim and tiny.state_size == config.state_size
    assert tiny.num_heads * tiny.head_dim == tiny.expand * tiny.hidden_size
    assert tiny.num_heads % tiny.n_groups == 0
    seeded_model(tiny)


def test_falcon_h1_inner_size_follows_the_heads() -> None:
    tiny = tiny_config(AutoConfig.for_model("falcon_h1"), vocab_size=64)
    assert tiny.mamba_d_ssm == tiny.mamba_n_heads * tiny.mamba_d_head
    seeded_model(tiny)


def test_build_failures_name_transformers_reason() -> None:
    tiny = tiny_config(AutoConfig.for_model("gemma3n").text_config, vocab_size=64)
    with pytest.raises(ModelConfigError, match=r"cannot build a 'gemma3n_text'.*layer types"):
        seeded_model(tiny)


def test_invalid_shrunk_config_is_a_model_config_error() -> None:
    config = AutoConfig.for_model("mamba2")
    with pytest.raises(ModelConfigError, match="--tiny: the shrunk 'mamba2' config is invalid"):
        tiny_config(config, num_heads=3)


def test_no_causal_lm_only_where_there_is_none() -> None:
    with pytest.raises(ModelConfigError, match="no causal LM for model_type 't5'"):
        seeded_model(AutoConfig.for_model("t5", num_layers=1, d_model=16, vocab_size=64))
