"""A random multi-request workload and a small FCFS scheduler driving a KVCacheManager.

Enough of an engine's scheduler to exercise the KV cache the way one does: chunked
prefill under a token budget, prefix-cache lookups on admission, decode one token at a
time, recompute preemption (newest running request first) when blocks run out.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from pagedkv.errors import NoFreeBlocksError
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.specs.mamba_chunking import MambaChunkRule, mamba_chunk_tokens

__all__ = [
    "WorkloadRequest",
    "random_workload",
    "ScheduledChunk",
    "MiniScheduler",
]


class WorkloadRequest(NamedTuple):
    """A prompt and the output tokens the request will generate, one per decode step."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]


def random_workload(
    seed: int,
    *,
    num_requests: int = 16,
    num_prefixes: int = 3,
    max_prefix_tokens: int = 24,
    max_suffix_tokens: int = 16,
    max_output_tokens: int = 16,
    vocab_size: int = 50,
) -> list[WorkloadRequest]:
    """Requests whose prompts often start with one of a few shared prefixes.

    Args:
        seed: seeds the random generator.
        num_requests: requests generated.
        num_prefixes: shared prefixes to draw from (75% of prompts start with one).
        max_prefix_tokens: the longest shared prefix, in tokens.
        max_suffix_tokens: the longest unique suffix, in tokens.
        max_output_tokens: the longest output, in tokens.
        vocab_size: token ids are drawn from ``[0, vocab_size)``.
    """
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_prefix_tokens))]
        for _ in range(num_prefixes)
    ]
    requests = []
    for i in range(num_requests):
        prefix = rng.choice(prefixes) if rng.random() < 0.75 else []
        suffix = [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_suffix_tokens))]
        outputs = [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_output_tokens))]
        requests.append(WorkloadRequest(f"req-{i}", (*prefix, *suffix), tuple(outputs)))
    return requests


class ScheduledChunk(NamedTuple):
    request: Request
    num_computed_tokens: int
    num_new_tokens: int


@dataclass
class MiniScheduler:
    """FCFS scheduling over ``manager``; ``step()`` returns what to run this step."""

    manager: KVCacheManager
    workload: list[WorkloadRequest]
    max_num_batched_tokens: int = 32
    max_num_seqs: int = 8
    arrivals_per_step: int = 2
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    num_preemptions: int = 0
    num_hit_tokens: int = 0
    num_finished: int = 0
    _next: int = 0
    # Mamba "align" groups: prefill chunks end where vLLM's scheduler ends them, so the
    # states at those ends exist to be cached; 0 = no clipping.
    _state_block_size: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if any(getattr(m, "align", False) for m in self.manager.managers):
            self._state_block_size = self.manager.scheduler_block_size

    def _split(self, request: Request, num_hit: int, num_new: int) -> int:
        """Tokens of a prefill chunk vLLM 0.33 schedules in align mode (0: none this step),
        by ``pagedkv.specs.mamba_chunking`` (the rule the simulator uses too)."""
        block = self._state_block_size
        if not block:
            return num_new
        return mamba_chunk_tokens(
            MambaChunkRule(block, block, self.max_num_batched_tokens),
            start=request.num_computed_tokens + num_hit,
            num_new_tokens=num_new,
            num_prompt_tokens=request.num_prompt_tokens,
            num_tokens=request.num_tokens,
            junction=request.shared_prefix_boundary,
        )

    @property
    def done(self) -> bool:
        return self._next == len(self.workload) and not self.waiting and not self.running

    def _arrive(self) -> None:
        for item in self.workload[self._next : self._next + self.arrivals_per_step]:
            self.waiting.append(Request(item.request_id, item.prompt_token_ids))
            self.outputs[item.request_id] = item.output_token_ids
        self._next = min(self._next + self.arrivals_per_step, len(self.workload))

    def _preempt(self) -> Request:
        victim = self.running.pop()
        self.manager.free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        return victim

    def _schedule_running(self, budget: int) -> tuple[list[ScheduledChunk], int, bool]:
        chunks: list[ScheduledChunk] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            num_new = self._split(request, 0, num_new)
            if num_new == 0:  # no block boundary fits this step (as vLLM skips it)
                i += 1
                continue
            while self.manager.allocate_slots(request, num_new) is None:
                preempted = True
                if self._preempt() is request:
                    break
            else:
                chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new))
                budget -= num_new
                i += 1
        return chunks, budget, preempted

    def _admit(self, budget: int) -> list[ScheduledChunk]:
        chunks = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            blocks, num_hit = self.manager.get_computed_blocks(request)
            num_new = self._split(request, num_hit, min(request.num_tokens - num_hit, budget))
            if num_new == 0:
                break
            if self.manager.allocate_slots(request, num_new, num_hit, blocks) is None:
                if not self.running:
                    raise NoFreeBlocksError(
                        f"request {request.request_id!r} ({request.num_tokens} tokens) does not "
                        f"fit in an empty KV cache of {self.manager.block_pool.num_blocks} blocks"
                    )
                break
            self.waiting.popleft()
            request.num_computed_tokens = num_hit
            self.num_hit_tokens += num_hit
            self.running.append(request)
            chunks.append(ScheduledChunk(request, num_hit, num_new))
            budget -= num_new
        return chunks

    def step(self) -> list[ScheduledChunk]:
        """Admit arrivals, schedule running requests, then waiting ones if none was preempted."""
        self.manager.new_step_starts()
        self._arrive()
        chunks, budget, preempted = self._schedule_running(self.max_num_batched_tokens)
        if not preempted:
            chunks += self._admit(budget)
        return chunks

    def finish_step(self, chunks: list[ScheduledChunk]) -> None:
        """Mark the chunks computed; a request past its prompt samples its next token or ends."""
        for chunk in chunks:
            request = chunk.request
            request.num_computed_tokens = chunk.num_computed_tokens + chunk.num_new_tokens
            if request.num_computed_tokens < request.num_tokens:
                continue
            outputs = self.outputs[request.request_id]
            if request.num_output_tokens < len(outputs):
                request.append_output_token_ids(outputs[request.num_output_tokens])
                continue
            self.manager.free(request)
            self.running.remove(request)
            self.num_finished += 1
