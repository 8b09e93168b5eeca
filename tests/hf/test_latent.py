"""DeepSeek-V2-Lite and DeepSeek-V3 (MLA): the compressed latent lives in pagedkv's
latent cache (one 576-value row per token, no per-head K/V), token-identical to
``generate()`` with hits and preemption. The latent sizes are the real configs'."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.hf.harness import Case, assert_continuous_batching, generator, run

from pagedkv.specs import MLAAttentionSpec

CASES = {
    "deepseek-v2-lite": Case("DeepSeek-V2-Lite", num_blocks=8),
    "deepseek-v3": Case("DeepSeek-V3", num_blocks=8),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_token_identical_through_the_latent_cache(name: str) -> None:
    case = CASES[name]
    assert_continuous_batching(case, run(case))


def test_the_cache_holds_one_latent_row_per_token() -> None:
    gen = generator(CASES["deepseek-v3"])
    config = gen.model.config
    for view in gen.memory.layers.values():
        assert isinstance(view.spec, MLAAttentionSpec)
        assert view.layout == "latent"
        assert view.tensor.shape[1:] == (16, config.kv_lora_rank + config.qk_rope_head_dim)
