"""Reference sliding window (R-SWA): full attention whose decode gap is freed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.runtime.block_pool import NULL_BLOCK
from pagedkv.runtime.managers.full import FullAttentionManager
from pagedkv.specs.base import cdiv

__all__ = [
    "RSWAManager",
]


class RSWAManager(FullAttentionManager):
    """The prompt's blocks and the last ``rswa_window`` decoded tokens' blocks stay; the
    blocks wholly between them (the gap) are nulled and freed as decoding moves on."""

    skips_tokens = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rswa_window: int = self.kv_cache_spec.rswa_window  # type: ignore[attr-defined]

    def gap_block_range(self, num_prompt_tokens: int, num_computed_tokens: int) -> range:
        """Table positions of the gap: from the first block after the prompt up to the
        block holding the window's first token (excluded)."""
        window_start = max(num_prompt_tokens, num_computed_tokens - self.rswa_window)
        return range(cdiv(num_prompt_tokens, self.block_size), window_start // self.block_size)

    def remove_skipped_blocks(
        self,
        request_id: str,
        num_computed_tokens: int,
        peers: Sequence[Any] = (),
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Free the gap, newest block first, down to the first already-null entry (vLLM's
        walk). Without a prompt length nothing is freed (full attention).

        Args:
            request_id: the running request.
            num_computed_tokens: tokens computed so far; the window ends at them.
            peers: unused (each R-SWA manager frees its own gap).
            num_prompt_tokens: the request's prompt length (None: free nothing).
        """
        table = self.req_to_blocks.get(request_id)
        if num_prompt_tokens is None or not table:
            return
        gap = self.gap_block_range(num_prompt_tokens, num_computed_tokens)
        last = min(gap.stop, len(table))
        indices: list[int] = []
        for i in range(last - 1, gap.start - 1, -1):
            if table[i] == NULL_BLOCK:
                break
            indices.append(i)
        if indices:
            blocks = [table[i] for i in indices]
            for i in indices:
                table[i] = NULL_BLOCK
            self.retention.release(request_id, indices, blocks)
