"""Trace records that carry their prompt: token ids, a text prompt or chat messages.

A JSONL line ``{"timestamp": ms, "token_ids": [...], "output_length": n}`` (also
``prompt_token_ids``) is replayed on exactly those tokens; ``"prompt": "text"`` or
``"messages": [{"role": ..., "content": ...}]`` is first tokenized by the model's
tokenizer (see :mod:`pagedkv.models.tokenizer`). The output length is ``output_length``
or ``max_tokens``; ``timestamp`` (milliseconds, default 0) and ``priority`` (default 0)
are optional.

The prompt is cut into chunks of ``CHUNK_TOKENS`` tokens whose segment ids are chained
content hashes, so two prompts with the same leading tokens share their leading
segments (and the clairvoyant bound sees the sharing at any block size that is a
multiple of ``CHUNK_TOKENS``); equal chunks are stored once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from pagedkv.sim.traces.trace import Segment, TraceRequest, unique_segment_id

__all__ = ["CHUNK_TOKENS", "TOKEN_FIELDS", "TEXT_FIELDS", "ChunkTable", "token_request"]

CHUNK_TOKENS = 16
TOKEN_FIELDS = ("token_ids", "prompt_token_ids")
TEXT_FIELDS = ("prompt", "messages")
Tokenize = Callable[[Any], list[int]]


class ChunkTable:
    """Content-addressed prompt chunks: the same tokens after the same prefix get the
    same (non-negative) segment id and one shared tuple."""

    def __init__(self) -> None:
        self._chunks: dict[int, tuple[int, ...]] = {}

    def segments(self, token_ids: list[int]) -> tuple[Segment, ...]:
        out: list[Segment] = []
        parent = b""
        for start in range(0, len(token_ids), CHUNK_TOKENS):
            chunk = tuple(token_ids[start : start + CHUNK_TOKENS])
            digest = hashlib.blake2b(
                parent + b"".join(t.to_bytes(8, "little") for t in chunk), digest_size=8
            ).digest()
            segment_id = int.from_bytes(digest, "little") >> 2
            stored = self._chunks.setdefault(segment_id, chunk)
            out.append(Segment(segment_id, len(chunk), stored))
            parent = digest
        return tuple(out)


def _token_ids(record: dict[str, Any], tokenize: Tokenize | None) -> list[int]:
    for field in TOKEN_FIELDS:
        if field in record:
            ids = record[field]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
            ):
                raise ValueError(f"field {field!r} must be a list of integers >= 0")
            return ids
    field = "prompt" if "prompt" in record else "messages"
    value = record[field]
    if field == "prompt" and not isinstance(value, str):
        raise ValueError("field 'prompt' must be a string")
    if field == "messages" and not (
        isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)
    ):
        raise ValueError("field 'messages' must be a list of {role, content} objects")
    if tokenize is None:
        raise ValueError(f"field {field!r} holds text: it needs the model's tokenizer")
    return list(tokenize(value))


def _output_length(record: dict[str, Any]) -> int:
    for field in ("output_length", "max_tokens"):
        if field in record:
            value = record[field]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"field {field!r} must be an integer >= 0, got {value!r}")
            return value
    raise ValueError("missing the output length: field 'output_length' or 'max_tokens'")


def token_request(
    record: dict[str, Any],
    index: int,
    chunks: ChunkTable,
    tokenize: Tokenize | None,
    arrival_s: float,
    priority: int,
) -> TraceRequest:
    """One record with token ids, a text prompt or chat messages -> a request.

    Args:
        record: the JSON record (token ids, a text prompt or chat messages).
        index: the request's index in the trace, for unique segment ids.
        chunks: the table splitting token ids into shared segments.
        tokenize: turns text into token ids (None: text is an error).
        arrival_s: the arrival time in seconds.
        priority: the request's priority.
    """
    token_ids = _token_ids(record, tokenize)
    if not token_ids:
        raise ValueError("the prompt is empty (no tokens)")
    output_id = unique_segment_id(index, 0)
    return TraceRequest(
        arrival_s, chunks.segments(token_ids), _output_length(record), output_id, priority
    )
