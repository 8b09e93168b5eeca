"""The tensors check's FCFS scheduler, with outputs sampled by the model instead of
read from a script: a request ends after ``max_new_tokens`` or an end-of-sequence token."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pagedkv.tensors.workload import MiniScheduler, ScheduledChunk

__all__ = [
    "end_of",
    "reaches_end",
    "GenerationScheduler",
]


def end_of(chunk: ScheduledChunk) -> int:
    """Tokens the chunk's request has computed once the chunk ran."""
    return chunk.num_computed_tokens + chunk.num_new_tokens


def reaches_end(chunk: ScheduledChunk) -> bool:
    """Whether the chunk computes its request's last token (the request then samples)."""
    return end_of(chunk) == chunk.request.num_tokens


@dataclass
class GenerationScheduler(MiniScheduler):
    eos_token_ids: frozenset[int] = frozenset()
    generated: dict[str, list[int]] = field(default_factory=dict)

    def finish_with_tokens(self, chunks: list[ScheduledChunk], sampled: Mapping[str, int]) -> None:
        """Advance the chunks; append each sampled token; free requests that are done."""
        for chunk in chunks:
            request = chunk.request
            request.num_computed_tokens = chunk.num_computed_tokens + chunk.num_new_tokens
            token = sampled.get(request.request_id)
            if token is None:
                continue
            request.append_output_token_ids(token)
            limit = len(self.outputs[request.request_id])
            if request.num_output_tokens >= limit or token in self.eos_token_ids:
                self.generated[request.request_id] = list(request.output_token_ids)
                self.manager.free(request)
                self.running.remove(request)
                self.num_finished += 1
