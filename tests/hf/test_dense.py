"""Llama (full attention) and Qwen3 (full, GQA) through pagedkv, token-identical to
``generate()``, with cache hits and preemption in the same run."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.hf.harness import Case, assert_continuous_batching, generator, prompts_for, run, tiny

CASES = {
    "llama": Case("Llama-3.1-8B"),
    "qwen3": Case("Qwen3-8B"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_token_identical_with_hits_and_preemption(name: str) -> None:
    case = CASES[name]
    assert_continuous_batching(case, run(case))


def test_qwen3_is_grouped_query_attention() -> None:
    config = tiny(CASES["qwen3"]).config
    assert config.num_attention_heads > config.num_key_value_heads


def test_a_corrupted_block_id_changes_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES["llama"]
    gen = generator(case)
    metadata = gen.metadata
    corrupted_steps = []

    def corrupted(chunks, manager):
        meta = metadata(chunks, manager)
        # request prompt-0's decode steps read its second block through its first's id
        for row, chunk in enumerate(chunks):
            if chunk.request.request_id == "prompt-0" and chunk.num_new_tokens == 1:
                table = meta[0].block_table
                assert int(table[row, 0]) != int(table[row, 1])
                table[row, 1] = table[row, 0]
                corrupted_steps.append(row)
        return meta

    monkeypatch.setattr(gen, "metadata", corrupted)
    output = gen.generate(prompts_for(case), case.max_new_tokens, arrivals_per_step=1)
    assert corrupted_steps
    assert output.token_ids != run(case).token_ids


def test_prefix_hits_skip_computing_the_prefix() -> None:
    case = CASES["llama"]
    with_hits = run(case).figures
    gen = generator(case)
    gen_no_cache = type(gen)(
        tiny(case),
        num_blocks=case.num_blocks,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        enable_prefix_caching=False,
    )
    without = gen_no_cache.generate(prompts_for(case), case.max_new_tokens).figures
    assert without.num_hit_tokens == 0
    assert with_hits.num_computed_tokens < without.num_computed_tokens


def test_the_engine_config_is_the_models_with_the_engine_settings() -> None:
    from pagedkv.hf import PagedGenerator
    from pagedkv.hf.specs import dtype_name

    model = tiny(CASES["qwen3"])
    gen = PagedGenerator(model, num_blocks=40, block_size=8, max_model_len=256, max_num_seqs=3)
    config = gen.config
    assert (config.model.name, config.model.dtype) == ("qwen3", dtype_name(model))
    assert (config.block_size, config.max_model_len, config.cache.cache_dtype) == (
        8,
        256,
        dtype_name(model),
    )
    assert (config.scheduler.max_num_seqs, config.cache.num_gpu_blocks_override) == (3, 40)
