"""Small pieces of pagedkv.hf: pass cutting at checkpoints, the byte codec, tiny layer
counts, special tokens of a shrunk vocabulary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from pagedkv.errors import ConfigError
from pagedkv.hf import PagedGenerator
from pagedkv.hf.load import load_tiny_model
from pagedkv.hf.state import state_pieces
from pagedkv.hf.text import ByteCodec
from pagedkv.hf.tiny import tiny_num_layers
from pagedkv.runtime import Request
from pagedkv.tensors.workload import ScheduledChunk


@given(
    start=st.integers(0, 300),
    length=st.integers(1, 200),
    block_size=st.integers(1, 64),
    nulls=st.sets(st.integers(0, 10)),
)
@pytest.mark.slow
def test_pieces_cover_the_chunk_and_cut_only_at_real_checkpoints(
    start: int, length: int, block_size: int, nulls: set[int]
) -> None:
    chunk = ScheduledChunk(Request("r", list(range(start + length))), start, length)
    table = [0 if i in nulls else i + 1 for i in range((start + length) // block_size + 1)]
    pieces = state_pieces(chunk, block_size, [table])
    assert pieces[0].num_computed_tokens == start
    ends = [p.num_computed_tokens + p.num_new_tokens for p in pieces]
    assert ends[-1] == start + length
    assert all(p.num_new_tokens > 0 for p in pieces)
    assert [p.num_computed_tokens for p in pieces[1:]] == ends[:-1]  # contiguous
    for cut in ends[:-1]:
        assert cut % block_size == 0 and table[cut // block_size - 1] != 0
    real_inside = [
        b
        for b in range(start + 1, start + length)
        if b % block_size == 0 and table[b // block_size - 1]
    ]
    assert ends[:-1] == real_inside  # every real checkpoint inside the chunk is cut at
    assert state_pieces(chunk, None, [table]) == [chunk]


@given(st.text())
def test_byte_codec_round_trips(text: str) -> None:
    codec = ByteCodec(vocab_size=1000)
    assert codec.decode(codec.encode(text)) == text
    assert codec.decode([104, 300, 105]) == "h<300>i"


def test_tiny_layer_count_covers_every_layer_kind() -> None:
    class Config:
        num_hidden_layers = 32
        layer_types = ["mamba"] * 10 + ["attention"] + ["mamba"] * 21

    assert tiny_num_layers(Config()) == 11

    class Dense:
        num_hidden_layers = 32

    assert tiny_num_layers(Dense()) == 2


def test_tiny_config_of_llama() -> None:
    import torch

    from pagedkv.hf.load import transformers_config
    from pagedkv.hf.tiny import tiny_config

    config = tiny_config(transformers_config("Llama-3.1-8B"), vocab_size=512)
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (2, 64, 16)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 1)  # real 32 : 8
    assert config.eos_token_id is None and config.bos_token_id is None  # 128000+ > 512
    assert config.dtype == torch.float32
    full = tiny_config(transformers_config("Llama-3.1-8B"))
    assert full.vocab_size == 128256 and full.eos_token_id is not None


def test_two_cache_layers_in_one_decoder_layer_are_refused() -> None:
    import pytest

    from pagedkv.hf.attention import HFIntegrationError, views_by_layer
    from pagedkv.tensors import LayerView

    views = {
        name: LayerView(name, 0, None, "NHD", ())  # type: ignore[arg-type]
        for name in ("model.layers.0.self_attn", "model.layers.0.self_attn.indexer")
    }
    with pytest.raises(HFIntegrationError, match="two cache layers"):
        views_by_layer(views)
    with pytest.raises(HFIntegrationError, match="has no 'layers"):
        views_by_layer({"decoder.attn": LayerView("decoder.attn", 0, None, "NHD", ())})  # type: ignore[arg-type]


def test_an_older_transformers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    from pagedkv.hf.attention import HFIntegrationError, register_attention

    monkeypatch.setattr(transformers, "__version__", "5.2.0")
    with pytest.raises(HFIntegrationError, match=r"needs transformers >= 5\.24"):
        register_attention()


@pytest.mark.slow
def test_generation_gives_the_model_back_its_attention_implementation() -> None:
    """After pagedkv's run the user's own generate() works as before (attention restored)."""
    model = load_tiny_model("Llama-3.1-8B", seed=1)
    before = model.config._attn_implementation
    PagedGenerator(model, num_blocks=64).generate([[3, 4, 5]], 2)
    assert model.config._attn_implementation == before
    model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, do_sample=False)


@pytest.mark.slow
def test_a_prompt_past_the_models_positions_is_refused() -> None:
    """The cache may fit more tokens than the model has positions; the model's limit holds."""
    model = load_tiny_model("Llama-3.1-8B", seed=1, max_position_embeddings=64)
    engine = PagedGenerator(model, num_blocks=64)
    assert engine.new_manager().max_model_len > 64
    engine.generate([[5] * 60], 4)  # 64 tokens: exactly the limit
    with pytest.raises(ConfigError, match="the model's 64 positions"):
        engine.generate([[5] * 61], 4)
    with pytest.raises(ConfigError, match=r"longer than .* 64 positions"):
        PagedGenerator(model, num_blocks=64, max_model_len=128)
