"""transformers' own greedy ``generate()``, one prompt at a time: the oracle the paged
engine must match token for token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from pagedkv.hf.rope import RopeRule, fixed_rope

__all__ = [
    "Mismatch",
    "reference_tokens",
    "first_mismatch",
]


class Mismatch(NamedTuple):
    """The first token where the paged engine and ``generate()`` disagree."""

    prompt_index: int
    position: int  # index into the generated tokens
    expected: tuple[int, ...]
    got: tuple[int, ...]

    def describe(self) -> str:
        want = self.expected[self.position] if self.position < len(self.expected) else "end"
        have = self.got[self.position] if self.position < len(self.got) else "end"
        return (
            f"prompt {self.prompt_index}: generated token {self.position} differs "
            f"(generate() gave {want}, pagedkv gave {have})"
        )


@torch.no_grad()
def reference_tokens(
    model: Any, prompt: Sequence[int], max_new_tokens: int, attn_implementation: str = "eager"
) -> tuple[int, ...]:
    """Greedy ``model.generate`` on ``prompt`` alone, with transformers' own cache.

    Args:
        model: a transformers causal LM.
        prompt: the prompt's token ids.
        max_new_tokens: tokens to generate.
        attn_implementation: the attention implementation to run with (restored afterwards).
    """
    previous = model.config._attn_implementation
    model.set_attn_implementation(attn_implementation)
    try:
        ids = torch.tensor([list(prompt)])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    finally:
        model.set_attn_implementation(previous)
    return tuple(int(t) for t in out[0, len(prompt) :])


def first_mismatch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    max_new_tokens: int,
    rope: RopeRule | None = None,
) -> Mismatch | None:
    """Compare each prompt's paged output with ``generate()``; the first difference.
    ``rope`` (the engine's :meth:`~pagedkv.hf.PagedGenerator.rope_rule`) fixes a
    batch-dependent RoPE in the reference the same way as in the engine.

    Args:
        model: a transformers causal LM.
        prompts: the prompts' token ids.
        outputs: the paged engine's output token ids, one sequence per prompt.
        max_new_tokens: tokens generated per prompt.
        rope: the engine's RoPE rule (None: the model's own).
    """
    for index, (prompt, got) in enumerate(zip(prompts, outputs, strict=True)):
        with fixed_rope(model, rope):
            expected = reference_tokens(model, prompt, max_new_tokens)
        got = tuple(got)
        if expected != got:
            position = next(
                (i for i, (a, b) in enumerate(zip(expected, got)) if a != b),
                min(len(expected), len(got)),
            )
            return Mismatch(index, position, expected, got)
    return None
