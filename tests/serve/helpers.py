"""A tiny engine in process, for the server's tests."""

from __future__ import annotations

from typing import Any

from pagedkv.hf import PagedGenerator
from pagedkv.hf.load import load_tiny_model
from pagedkv.hf.online import OnlineEngine
from pagedkv.hf.tokenizer import ChatTokenizer, tiny_tokenizer

MODEL = "Qwen3-8B"


def tiny_generator(**options: Any) -> PagedGenerator:
    tokenizer = ChatTokenizer(tiny_tokenizer())
    model = load_tiny_model(MODEL, seed=0, vocab_size=tokenizer.vocab_size)
    settings = {"num_blocks": 64, "block_size": 16, "max_num_batched_tokens": 64} | options
    return PagedGenerator(model, **settings)


def tiny_engine(**options: Any) -> OnlineEngine:
    return OnlineEngine(tiny_generator(), **options)
