"""pagedkv.hf refuses encoder-decoder models up front, whatever the cache size."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.hf import PagedGenerator
from pagedkv.hf.attention import HFIntegrationError
from pagedkv.hf.load import load_tiny_model


@pytest.mark.slow
@pytest.mark.parametrize("num_blocks", [8, 40, None])
def test_cross_attention_model_is_refused_before_planning(num_blocks: int | None) -> None:
    # BartForCausalLM keeps the decoder's cross-attention layers. Since the engine config
    # takes the encoder length from the model (1,024 tokens), planning a small cache failed
    # first, with an InsufficientMemoryError that hid the real reason.
    model = load_tiny_model("bart-large", seed=0, vocab_size=512)
    with pytest.raises(HFIntegrationError, match=r"bart: pagedkv\.hf runs decoder-only models"):
        PagedGenerator(model, num_blocks=num_blocks, max_num_batched_tokens=32)
