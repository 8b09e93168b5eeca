"""Small pieces of pagedkv.hf: pass cutting at checkpoints, the byte codec, tiny layer
counts, special tokens of a shrunk vocabulary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

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
