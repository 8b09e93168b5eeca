"""The model's tokenizer for traces with text prompts or chat messages (needs transformers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError

__all__ = ["TextTokenizer"]


class TextTokenizer:
    """Tokenizes a text prompt, or chat messages through the model's chat template
    (with the generation prompt, as a chat completion request is). Loads the tokenizer
    on first use: a trace of token ids never needs it."""

    def __init__(self, name_or_path: str | Path, revision: str | None = None) -> None:
        self.name_or_path = str(name_or_path)
        self.revision = revision
        self._tokenizer: Any = None

    def _load(self) -> Any:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ConfigError(
                "this trace holds text prompts or chat messages; tokenizing them needs "
                "transformers (pip install 'pagedkv[hf]'), or convert the trace to token ids "
                "(a 'token_ids' field) first"
            ) from None
        try:
            return AutoTokenizer.from_pretrained(self.name_or_path, revision=self.revision)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot load the tokenizer of {self.name_or_path!r} to tokenize the trace's "
                f"text ({exc}); give a model directory or Hub id with a tokenizer, or a trace "
                "of token ids"
            ) from None

    def __call__(self, prompt: str | list[dict[str, Any]]) -> list[int]:
        if self._tokenizer is None:
            self._tokenizer = self._load()
        if isinstance(prompt, str):
            return list(self._tokenizer.encode(prompt, add_special_tokens=True))
        if not getattr(self._tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer of {self.name_or_path!r} has no chat template; the trace's "
                "'messages' cannot be turned into a prompt (give 'prompt' text instead)"
            )
        ids = self._tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        if not isinstance(ids, list):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)
