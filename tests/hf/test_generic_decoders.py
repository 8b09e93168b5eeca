"""Decoders with no family adapter, read by the generic decoder reading
(``pagedkv.models.adapters.generic``): each family's transformers config class defaults,
shrunk by ``--tiny``, generates token-identically to ``generate()`` with prefix hits,
preemption and chunked prefill; families whose configs name state layers the reading
cannot size are refused with the fields at fault."""

from __future__ import annotations

import functools
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.hf.harness import Case, prompts_for

from pagedkv.errors import ModelConfigError
from pagedkv.hf import PagedGenerator
from pagedkv.hf.attention import HFIntegrationError
from pagedkv.hf.reference import first_mismatch
from pagedkv.hf.tiny import seeded_model, tiny_config

CASE = Case("generic")
READ = ["olmo2", "starcoder2", "gpt_neox", "granite", "smollm3", "exaone4"]
OVERRIDES: dict[str, dict[str, Any]] = {"exaone4": {"sliding_window": 16}}
NUM_BLOCKS = {"exaone4": 24}  # one block per layer group per 16 tokens
REFUSED = {
    "bamba": "mamba_d_state",
    "zamba2": "layers_block_type",
    "falcon_h1": "mamba_d_state",
    "minimax": "'linear' layer",
}


@functools.cache
def tiny_model(model_type: str) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    return seeded_model(tiny_config(config, vocab_size=512, **OVERRIDES.get(model_type, {})))


def _generator(model: Any, num_blocks: int = CASE.num_blocks) -> PagedGenerator:
    return PagedGenerator(model, num_blocks=num_blocks, max_num_batched_tokens=32, max_num_seqs=4)


@pytest.mark.parametrize("model_type", READ)
@pytest.mark.slow
def test_generic_reading_is_token_identical(model_type: str) -> None:
    model = tiny_model(model_type)
    gen = _generator(model, NUM_BLOCKS.get(model_type, CASE.num_blocks))
    output = gen.generate(prompts_for(CASE), CASE.max_new_tokens, arrivals_per_step=1)
    mismatch = first_mismatch(
        model, prompts_for(CASE), output.token_ids, CASE.max_new_tokens, gen.rope_rule()
    )
    assert mismatch is None, mismatch.describe()
    figures = output.figures
    assert figures.num_hit_tokens >= 32
    assert figures.num_preemptions >= 1
    assert figures.max_requests_per_step >= 2


def test_attention_outside_attention_interface_is_refused() -> None:
    """Falcon's attention calls torch itself with its own cache: the generic reading
    plans it, and the first pass stops instead of returning its own cache's tokens."""
    gen = _generator(tiny_model("falcon"))
    with pytest.raises(HFIntegrationError, match="AttentionInterface"):
        gen.generate(prompts_for(CASE), 2)
    assert tiny_model("falcon").config._attn_implementation != "pagedkv"


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_state_layer_families_are_refused_by_name(model_type: str) -> None:
    with pytest.raises(ModelConfigError, match=REFUSED[model_type]):
        _generator(tiny_model(model_type))
