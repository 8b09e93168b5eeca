"""A prompt's block hashes as its engines publish them, for index lookups from token ids."""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.config import CacheConfig
from pagedkv.events.wire import external_block_hash
from pagedkv.runtime.events import ExternalBlockHash
from pagedkv.runtime.hashing import BlockHash, BlockHasher, LoRA
from pagedkv.runtime.request import Request

__all__ = [
    "PromptHasher",
]


class PromptHasher:
    """External hashes of a prompt's full blocks, computed by the runtime's own hasher (same
    algorithm, seed, LoRA and cache-salt keys as the engines), so they match the hashes in
    the engines' BlockStored events. ``seed`` None: the runtime's (and vLLM's) default.

    Args:
        block_size: tokens per hashed block, as the engines' hash block size.
        hash_algo: the engines' prefix-cache hash algorithm (None: ``CacheConfig``'s default).
        seed: the hash seed (None: the runtime's and vLLM's default).
        int_block_hashes: give hashes as integers, as the engines' events do with
            ``int_block_hashes``.
    """

    def __init__(
        self,
        block_size: int,
        hash_algo: str | None = None,
        *,
        seed: str | None = None,
        int_block_hashes: bool = True,
    ) -> None:
        self.hasher = BlockHasher(block_size, hash_algo or CacheConfig().hash_algo, seed)
        self.int_block_hashes = int_block_hashes

    @property
    def block_size(self) -> int:
        return self.hasher.block_size

    def __call__(
        self,
        token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        lora_path: str = "",
        cache_salt: str | None = None,
    ) -> list[ExternalBlockHash]:
        lora = None if lora_name is None else LoRA(lora_name, 0, lora_path)
        request = Request("route", token_ids, lora=lora, cache_salt=cache_salt, hasher=self.hasher)
        return self.external(request.block_hashes)

    def external(self, block_hashes: Sequence[BlockHash]) -> list[ExternalBlockHash]:
        """Runtime hashes -> the published form."""
        ext = self.int_block_hashes
        return [external_block_hash(h, ext) for h in block_hashes]
