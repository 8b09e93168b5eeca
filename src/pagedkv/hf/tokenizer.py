"""Text and chat messages to token ids the way an OpenAI-compatible server does it.

``ChatTokenizer`` wraps a transformers tokenizer: completions encode the prompt with the
tokenizer's special tokens, chat requests render the chat template to text and encode
that without adding special tokens again (vLLM's order). The engine (``pagedkv serve``)
and the router use the same class, so the router hashes exactly the ids the engine
caches. ``tiny_tokenizer()`` builds a byte-level tokenizer with a chat template in
process (no files, no network): the tokenizer of ``pagedkv serve --tiny``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError, ModelConfigError

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "ChatTokenizer",
    "IncrementalDetokenizer",
    "load_chat_tokenizer",
    "tiny_tokenizer",
]

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_TINY_SPECIALS = ("<|system|>", "<|user|>", "<|assistant|>")
_PRINTABLE_BYTES = frozenset([*range(33, 127), *range(161, 173), *range(174, 256)])
MAX_MESSAGES = 4096


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (printable bytes stand for
    themselves, the others take code points from 256 on), as a vocabulary."""
    vocab: dict[str, int] = {}
    extra = 0
    for byte in range(256):
        if byte in _PRINTABLE_BYTES:
            vocab[chr(byte)] = byte
        else:
            vocab[chr(256 + extra)] = byte
            extra += 1
    return vocab


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer (ids 0-255 are the UTF-8 bytes) with ``<|bos|>``,
    ``<|eot|>``, role tokens and a chat template: 261 ids, built in process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(vocab=_byte_alphabet(), merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|bos|>", eos_token="<|eot|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(_TINY_SPECIALS)})
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def load_chat_tokenizer(model: str | Path | None, *, tiny: bool = False) -> ChatTokenizer:
    """The tiny tokenizer, or the tokenizer saved in ``model``'s directory (no download)."""
    if tiny:
        return ChatTokenizer(tiny_tokenizer())
    if model is None or not Path(model).is_dir():
        raise ConfigError(
            f"{model}: not a local model directory with a tokenizer (use --tiny for the "
            "built-in byte tokenizer; nothing is downloaded)"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(Path(model), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{model}: cannot load its tokenizer: {exc}") from None
    return ChatTokenizer(tokenizer)


class ChatTokenizer:
    """OpenAI request bodies to prompt token ids, and token ids back to text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = frozenset([] if eos is None else [int(eos)])

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def completion_ids(self, prompt: object) -> list[int]:
        """A completion's ``prompt``: a string, or a list of token ids taken as they are."""
        if isinstance(prompt, str):
            return [int(t) for t in self.tokenizer.encode(prompt, add_special_tokens=True)]
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return list(prompt)
        raise ValueError("prompt must be a string or a list of token ids (one prompt)")

    def chat_ids(self, messages: object) -> list[int]:
        """A chat's ``messages`` rendered with the chat template, generation prompt added."""
        if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
            raise ValueError(f"messages must be a list of 1 to {MAX_MESSAGES} messages")
        for m in messages:
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise ValueError("each message needs a string role and string content")
        clean = [{"role": m["role"], "content": m["content"]} for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                clean, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # the template is the model's code: any error is the input's
            raise ValueError(f"the chat template failed on these messages: {exc}") from None
        return [int(t) for t in self.tokenizer.encode(str(text), add_special_tokens=False)]

    def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        """The prompt token ids of an OpenAI request body."""
        return (
            self.chat_ids(body.get("messages")) if chat else self.completion_ids(body.get("prompt"))
        )

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))


class IncrementalDetokenizer:
    """Text deltas for a stream of token ids: the decoded text grows token by token, and
    a delta is held back while it ends in an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.num_chars_sent = 0

    def push(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        text = self.tokenizer.decode(self.token_ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[self.num_chars_sent :]
        self.num_chars_sent = len(text)
        return delta

    def flush(self) -> str:
        text = self.tokenizer.decode(self.token_ids)
        delta = text[self.num_chars_sent :]
        self.num_chars_sent = len(text)
        return delta
