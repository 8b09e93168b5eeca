"""Cache figures of one generation run: blocks used, hits, preemptions, window frees."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedkv.planning import KVCacheConfig
from pagedkv.runtime import KVCacheManager
from pagedkv.specs import ChunkedLocalAttentionSpec, SlidingWindowSpec
from pagedkv.tensors.workload import MiniScheduler, ScheduledChunk

__all__ = [
    "CacheFigures",
    "FigureCounter",
]


class CacheFigures(NamedTuple):
    """``num_hit_tokens``: prompt tokens served by the prefix cache over all admissions;
    ``num_window_null_blocks``: the most null entries seen in one request's table of a
    sliding-window or chunked group (blocks freed as the window moved, or skipped);
    ``max_blocks_used``: the most blocks held at once (the null block excluded);
    ``max_requests_per_step``: the most requests one step ran together."""

    num_blocks: int
    max_blocks_used: int
    num_steps: int
    num_prompt_tokens: int
    num_computed_tokens: int
    num_hit_tokens: int
    num_preemptions: int
    num_window_null_blocks: int
    max_requests_per_step: int

    def as_dict(self) -> dict[str, int]:
        return self._asdict()

    def line(self) -> str:
        return (
            f"blocks used {self.max_blocks_used}/{self.num_blocks - 1}, "
            f"hit tokens {self.num_hit_tokens}, preemptions {self.num_preemptions}, "
            f"window-freed blocks {self.num_window_null_blocks}, "
            f"computed tokens {self.num_computed_tokens}, steps {self.num_steps}"
        )


class FigureCounter:
    """Collects :class:`CacheFigures` step by step."""

    def __init__(
        self, manager: KVCacheManager, kv_cache_config: KVCacheConfig, prompts: Sequence[Any]
    ) -> None:
        self.manager = manager
        self.num_blocks = kv_cache_config.num_blocks
        self.local_groups = [
            gid
            for gid, g in enumerate(kv_cache_config.kv_cache_groups)
            if isinstance(g.kv_cache_spec, SlidingWindowSpec | ChunkedLocalAttentionSpec)
        ]
        self.num_prompt_tokens = sum(len(p) for p in prompts)
        self.max_blocks_used = self.num_steps = self.num_computed = self.max_nulls = 0
        self.max_requests = 0

    def record_step(self, chunks: Sequence[ScheduledChunk]) -> None:
        self.num_steps += 1
        self.num_computed += sum(c.num_new_tokens for c in chunks)
        self.max_requests = max(self.max_requests, len(chunks))
        used = self.num_blocks - 1 - self.manager.num_free_blocks
        self.max_blocks_used = max(self.max_blocks_used, used)
        if not self.local_groups:
            return  # copying every table each step for nothing
        for chunk in chunks:
            ids = self.manager.get_block_ids(chunk.request.request_id)
            for gid in self.local_groups:
                self.max_nulls = max(self.max_nulls, ids[gid].count(0))

    def figures(self, scheduler: MiniScheduler) -> CacheFigures:
        return CacheFigures(
            self.num_blocks,
            self.max_blocks_used,
            self.num_steps,
            self.num_prompt_tokens,
            self.num_computed,
            scheduler.num_hit_tokens,
            scheduler.num_preemptions,
            self.max_nulls,
            self.max_requests,
        )
