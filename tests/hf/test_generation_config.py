"""A checkpoint's generation_config.json: the processors generate() applies under greedy
decoding are applied the same way, or refused by name."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.hf import PagedGenerator
from pagedkv.hf.attention import HFIntegrationError
from pagedkv.hf.load import load_tiny_model
from pagedkv.hf.reference import first_mismatch

PROMPTS = [[7, 8, 9, 7, 8, 9, 7, 8], [11, 12, 13, 14] * 5, [3]]


@pytest.mark.parametrize(
    "settings",
    [
        {"repetition_penalty": 1.5},
        {"no_repeat_ngram_size": 2},
        {"suppress_tokens": [0, 1, 2, 3, 4, 5]},
        {"repetition_penalty": 1.2, "min_new_tokens": 4, "eos_token_id": 6},
    ],
    ids=["repetition_penalty", "no_repeat_ngram", "suppress_tokens", "min_new_tokens"],
)
def test_greedy_processors_match_generate(settings: dict[str, object]) -> None:
    model = load_tiny_model("Llama-3.1-8B", seed=2, vocab_size=32)
    for name, value in settings.items():
        setattr(model.generation_config, name, value)
    engine = PagedGenerator(model, num_blocks=64, max_num_batched_tokens=16)
    output = engine.generate(PROMPTS, 8, arrivals_per_step=2)
    assert first_mismatch(model, PROMPTS, output.token_ids, 8) is None


def test_the_penalty_changes_the_tokens() -> None:
    """The processor matters on this model (so the test above can fail)."""
    model = load_tiny_model("Llama-3.1-8B", seed=2, vocab_size=32)
    plain = PagedGenerator(model, num_blocks=64).generate(PROMPTS, 8).token_ids
    model.generation_config.repetition_penalty = 1.5
    penalised = PagedGenerator(model, num_blocks=64).generate(PROMPTS, 8).token_ids
    assert plain != penalised


@pytest.mark.slow
def test_beam_search_in_the_generation_config_is_refused() -> None:
    model = load_tiny_model("Llama-3.1-8B", seed=2)
    model.generation_config.num_beams = 4
    with pytest.raises(HFIntegrationError, match=r"generation_config\.num_beams=4"):
        PagedGenerator(model, num_blocks=64)
