"""Request traces: what arrives when, which token segments its prompt is made of."""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "Segment",
    "TraceRequest",
    "Trace",
    "unique_segment_id",
]


class Segment(NamedTuple):
    """``num_tokens`` tokens of the deterministic token stream named ``segment_id``, or
    the first ``num_tokens`` of ``token_ids`` when the trace gave real token ids.

    Two segments with the same id share their common leading tokens, so a segment
    cut short (a last partial block) is a prefix of the full one. A reader that gives
    ``token_ids`` must give equal ids to equal token lists.
    """

    segment_id: int
    num_tokens: int
    token_ids: tuple[int, ...] | None = None


class TraceRequest(NamedTuple):
    """One request: arrival time, prompt segments, output length and output stream."""

    arrival_s: float
    segments: tuple[Segment, ...]
    num_output_tokens: int
    output_segment_id: int
    # vLLM's request priority (lower is served first under the priority policy)
    priority: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return sum(seg.num_tokens for seg in self.segments)


class Trace(NamedTuple):
    """A named list of requests, plus how many malformed lines were skipped and how many
    requests the source holds in all (``None``: exactly these; more when a limit cut it)."""

    name: str
    requests: tuple[TraceRequest, ...]
    num_skipped_lines: int = 0
    num_source_requests: int | None = None

    def head(self, limit: int | None) -> Trace:
        """The first ``limit`` requests (all when ``limit`` is None)."""
        if limit is None or limit >= len(self.requests):
            return self
        total = self.total_requests
        return self._replace(requests=self.requests[:limit], num_source_requests=total)

    @property
    def total_requests(self) -> int:
        """Requests in the whole source (the trace file, the synthetic config)."""
        if self.num_source_requests is None:
            return len(self.requests)
        return max(self.num_source_requests, len(self.requests))

    @property
    def num_prompt_tokens(self) -> int:
        return sum(req.num_prompt_tokens for req in self.requests)

    @property
    def num_shared_prefix_requests(self) -> int:
        """Requests whose first segment an earlier request also starts with: the only
        ones a prefix cache can serve (0 for a trace of unique prompts, such as Azure's)."""
        seen: set[int] = set()
        shared = 0
        for req in self.requests:
            if not req.segments:
                continue
            first = req.segments[0].segment_id
            shared += first in seen
            seen.add(first)
        return shared


def unique_segment_id(request_index: int, slot: int) -> int:
    """A segment id no trace-supplied (non-negative) id can collide with.

    ``slot`` 0 is the request's output stream; 1 and up are per-request fillers.
    """
    return -(request_index * 4 + slot + 1)
