"""Deterministic token ids for trace segments (equal segment ids give equal tokens)."""

from __future__ import annotations

import hashlib
import sys
from array import array

from pagedkv.sim.traces.trace import Segment, TraceRequest

__all__ = [
    "segment_tokens",
    "prompt_tokens",
    "output_tokens",
]

_BIG_ENDIAN = sys.byteorder == "big"


def segment_tokens(
    segment_id: int, num_tokens: int, token_ids: tuple[int, ...] | None = None
) -> list[int]:
    """The first ``num_tokens`` ids of stream ``segment_id``: uint16 words of a SHAKE-128 XOF
    (or of ``token_ids``, a trace's own tokens).

    An extendable-output function makes a shorter stream a prefix of a longer one.
    """
    if num_tokens <= 0:
        return []
    if token_ids is not None:
        return list(token_ids[:num_tokens])
    key = segment_id.to_bytes(16, "little", signed=True)
    words = array("H", hashlib.shake_128(key).digest(2 * num_tokens))
    if _BIG_ENDIAN:
        words.byteswap()
    return words.tolist()


def prompt_tokens(request: TraceRequest) -> list[int]:
    """The request's prompt token ids: its segments' tokens, concatenated."""
    segments = request.segments
    if len(segments) == 1:
        return segment_tokens(*segments[0])
    out: list[int] = []
    cache: dict[Segment, list[int]] = {}
    for seg in segments:
        toks = cache.get(seg)
        if toks is None:
            toks = cache[seg] = segment_tokens(*seg)
        out += toks
    return out


def output_tokens(request: TraceRequest) -> list[int]:
    """The token ids the simulated model generates for ``request``."""
    return segment_tokens(request.output_segment_id, request.num_output_tokens)
