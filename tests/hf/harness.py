"""One run per architecture: a tiny model, prompts sharing a long prefix, a cache small
enough to preempt, requests arriving one per step; every output compared with
``generate()`` per prompt alone."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from pagedkv.hf import GenerationOutput, PagedGenerator
from pagedkv.hf.load import load_tiny_model
from pagedkv.hf.reference import first_mismatch

VOCAB = 512


@dataclass(frozen=True)
class Case:
    model: str
    overrides: tuple[tuple[str, Any], ...] = ()
    prefix_tokens: int = 64
    suffix_tokens: int = 8
    num_prompts: int = 4
    max_new_tokens: int = 12
    num_blocks: int = 11
    block_size: int = 16
    max_num_batched_tokens: int = 32


def prompts_for(case: Case, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, VOCAB) for _ in range(case.prefix_tokens)]
    return [
        prefix + [rng.randrange(1, VOCAB) for _ in range(case.suffix_tokens + i)]
        for i in range(case.num_prompts)
    ]


@functools.cache
def tiny(case: Case) -> Any:
    return load_tiny_model(case.model, seed=0, vocab_size=VOCAB, **dict(case.overrides))


def generator(case: Case) -> PagedGenerator:
    return PagedGenerator(
        tiny(case),
        num_blocks=case.num_blocks,
        block_size=case.block_size,
        max_num_batched_tokens=case.max_num_batched_tokens,
        max_num_seqs=4,
    )


@functools.cache
def run(case: Case) -> GenerationOutput:
    return generator(case).generate(prompts_for(case), case.max_new_tokens, arrivals_per_step=1)


def assert_token_identical(case: Case, output: GenerationOutput) -> None:
    mismatch = first_mismatch(tiny(case), prompts_for(case), output.token_ids, case.max_new_tokens)
    assert mismatch is None, mismatch.describe()


def assert_continuous_batching(
    case: Case, output: GenerationOutput, *, min_hit_tokens: int | None = None
) -> None:
    """Token-identical to ``generate()``, with prefix hits (at least ``min_hit_tokens``,
    default half the shared prefix; 0 skips), a preemption, several requests per step and
    never more blocks than the cache has."""
    assert_token_identical(case, output)
    figures = output.figures
    wanted = case.prefix_tokens // 2 if min_hit_tokens is None else min_hit_tokens
    assert figures.num_hit_tokens >= wanted  # later requests hit the shared prefix
    assert figures.num_preemptions >= 1
    assert figures.max_requests_per_step >= 2  # batched, not one by one
    assert figures.max_blocks_used <= figures.num_blocks - 1
