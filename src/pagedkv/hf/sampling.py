"""Greedy choice of the next token, with the logits processors ``generate()`` applies under
greedy decoding when the checkpoint's ``generation_config.json`` asks for them.

``generate(do_sample=False)`` still runs every processor the generation config enables
(a repetition penalty, a minimum length, suppressed tokens, ...) before its argmax, so a
checkpoint that ships one changes transformers' tokens. :class:`GreedySampler` builds the
same processors, with transformers' own classes, and applies them to each request's row of
logits with that request's tokens so far. Settings it cannot reproduce per request (beam
search, classifier-free guidance, a length-decay penalty) are refused up front, by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pagedkv.hf.attention import HFIntegrationError

__all__ = ["GreedySampler", "UNSUPPORTED_SETTINGS"]

# generation_config fields whose greedy effect pagedkv does not reproduce, with the value
# that means "off".
UNSUPPORTED_SETTINGS: dict[str, Any] = {
    "num_beams": 1,
    "guidance_scale": None,
    "exponential_decay_length_penalty": None,
}


def _is_off(name: str, value: Any, off: Any) -> bool:
    if name == "guidance_scale":
        return value is None or value == 1
    return value is None or value == off


class GreedySampler:
    """Picks each request's next token: argmax of its logits after the generation
    config's processors (none for most checkpoints: then a plain argmax)."""

    def __init__(self, generation_config: Any, eos_token_ids: Sequence[int]) -> None:
        for name, off in UNSUPPORTED_SETTINGS.items():
            value = getattr(generation_config, name, None)
            if not _is_off(name, value, off):
                raise HFIntegrationError(
                    f"generation_config.{name}={value!r}: generate() would use it under greedy "
                    "decoding and pagedkv.hf does not reproduce it; remove it from the "
                    "checkpoint's generation_config.json"
                )
        self.config = generation_config
        self.eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long)
        self.active = bool(self._processors(1))

    @classmethod
    def for_model(cls, model: Any, eos_token_ids: Sequence[int]) -> GreedySampler:
        return cls(model.generation_config, eos_token_ids)

    def _processors(self, num_prompt_tokens: int) -> list[Any]:
        """transformers' processors for one request, in generate()'s order."""
        from transformers.generation import logits_process as lp

        config, eos = self.config, self.eos
        processors: list[Any] = []
        if config.sequence_bias is not None:
            processors.append(lp.SequenceBiasLogitsProcessor(sequence_bias=config.sequence_bias))
        if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
            processors.append(lp.RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
        if config.no_repeat_ngram_size:
            processors.append(lp.NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
        if config.bad_words_ids is not None:
            processors.append(lp.NoBadWordsLogitsProcessor(config.bad_words_ids, eos))
        if config.min_length and len(eos):
            processors.append(lp.MinLengthLogitsProcessor(config.min_length, eos))
        if config.min_new_tokens and len(eos):
            processors.append(
                lp.MinNewTokensLengthLogitsProcessor(num_prompt_tokens, config.min_new_tokens, eos)
            )
        if config.forced_bos_token_id is not None:
            processors.append(lp.ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
        if config.forced_eos_token_id is not None:
            processors.append(
                lp.ForcedEOSTokenLogitsProcessor(config.max_length, config.forced_eos_token_id)
            )
        if config.remove_invalid_values is True:
            processors.append(lp.InfNanRemoveLogitsProcessor())
        if config.suppress_tokens is not None:
            processors.append(lp.SuppressTokensLogitsProcessor(config.suppress_tokens))
        if config.begin_suppress_tokens is not None:
            begin = num_prompt_tokens
            if num_prompt_tokens <= 1 and config.forced_bos_token_id is not None:
                begin += 1
            processors.append(
                lp.SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, begin)
            )
        return processors

    def choose(
        self,
        logits: torch.Tensor,
        token_ids: Sequence[Sequence[int]],
        num_prompt_tokens: Sequence[int],
    ) -> list[int]:
        """The next token of each row of ``logits`` (``[rows, vocab]``), row ``i`` belonging
        to a request with ``token_ids[i]`` so far, ``num_prompt_tokens[i]`` of them prompt."""
        if not self.active:
            return [int(t) for t in logits.argmax(dim=-1)]
        chosen: list[int] = []
        for row, tokens, prompt_len in zip(logits, token_ids, num_prompt_tokens, strict=True):
            ids = torch.tensor([list(tokens)], dtype=torch.long)
            scores = row[None].float()
            for processor in self._processors(prompt_len):
                scores = processor(ids, scores)
            chosen.append(int(scores.argmax(dim=-1)))
        return chosen
