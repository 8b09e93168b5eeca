"""Text to token ids and back: the model's tokenizer when one is on disk, else bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "TextCodec",
    "ByteCodec",
    "TokenizerCodec",
    "text_codec",
]


class TextCodec(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteCodec:
    """UTF-8 bytes as token ids 0-255; any other id prints as ``<id>``."""

    name = "bytes"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        parts: list[str] = []
        run = bytearray()
        for token in token_ids:
            if token < 256:
                run.append(token)
                continue
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            parts.append(f"<{token}>")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


class TokenizerCodec:
    """A transformers tokenizer read from a local directory."""

    name = "tokenizer"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))


def text_codec(model: str | Path, vocab_size: int) -> TextCodec:
    """The tokenizer in ``model``'s directory when there is one, else :class:`ByteCodec`."""
    directory = Path(model)
    directory = directory if directory.is_dir() else directory.parent
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return ByteCodec(vocab_size)
    from transformers import AutoTokenizer

    try:
        return TokenizerCodec(AutoTokenizer.from_pretrained(directory, local_files_only=True))
    except (OSError, ValueError):
        return ByteCodec(vocab_size)
