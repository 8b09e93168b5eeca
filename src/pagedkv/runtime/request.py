"""A request as the KV cache sees it: tokens, extra hash keys and block hashes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.hashing import BlockHash, BlockHasher, LoRA, MultiModalFeature

__all__ = [
    "KV_CACHE_REPORT_MODES",
    "Request",
]

KV_CACHE_REPORT_MODES = ("incremental", "full")


class Request:
    """Token ids (prompt then outputs), hash keys (LoRA, cache salt, multimodal items,
    prompt embeddings) and the chained block hashes, extended as tokens are appended.

    Args:
        request_id: the request's id, unique among live requests.
        prompt_token_ids: the prompt's token ids.
        lora: a ``LoRA`` or any object with vLLM's ``LoRARequest`` fields (None: none).
        lora_name: the LoRA adapter's name, when ``lora`` is None (an id-0 ``LoRA``).
        cache_salt: a salt keying the first block, so that only requests with the same
            salt share its prefix.
        mm_features: the prompt's multimodal items (``MultiModalFeature`` or
            ``(identifier, offset, length)``, positions in tokens), in any order.
        prompt_embeds: prompt embeddings (a tensor or any buffer, one row per prompt
            token); each block's slice keys its hash.
        hasher: hash the blocks now with it (None: the manager attaches its own).
        priority: the scheduling priority (vLLM's: lower is more important).
        kv_cache_report_mode: what its KV events report: ``"incremental"`` or ``"full"``
            (prefix-cache hits re-announced as BlockStored).
        session_id: reported in its BlockStored events.
        allow_empty_prompt: accept a request with no prompt tokens (vLLM does: its
            tokens then come only from what the engine appends).

    Raises:
        KVCacheRuntimeError: an empty prompt (unless allowed) or an unknown
            ``kv_cache_report_mode``.
    """

    __slots__ = (
        "all_token_ids",
        "block_hashes",
        "cache_salt",
        "hasher",
        "kv_cache_report_mode",
        "lora",
        "mm_features",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "plain",
        "priority",
        "prompt_embeds",
        "request_id",
        "session_id",
        "shared_prefix_boundary",
        "skip_reading_prefix_cache",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        lora: Any = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        mm_features: Iterable[MultiModalFeature] = (),
        prompt_embeds: Any = None,
        hasher: BlockHasher | None = None,
        priority: int = 0,
        kv_cache_report_mode: str = "incremental",
        session_id: str | None = None,
        allow_empty_prompt: bool = False,
    ) -> None:
        if not prompt_token_ids and not allow_empty_prompt:
            raise KVCacheRuntimeError(f"request {request_id!r}: prompt_token_ids is empty")
        if kv_cache_report_mode not in KV_CACHE_REPORT_MODES:
            raise KVCacheRuntimeError(
                f"request {request_id!r}: kv_cache_report_mode must be one of "
                f"{', '.join(KV_CACHE_REPORT_MODES)}, got {kv_cache_report_mode!r}"
            )
        self.request_id = request_id
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.all_token_ids)
        if lora is not None and not isinstance(lora, LoRA):
            lora = LoRA(lora.lora_name, lora.lora_int_id, lora.lora_path)
        self.lora: LoRA | None = lora if lora is not None or lora_name is None else LoRA(lora_name)
        self.prompt_embeds = prompt_embeds
        self.cache_salt = cache_salt
        self.priority = priority  # vLLM's: lower is more important
        # "full": KV events re-announce this request's prefix-cache hits as BlockStored.
        self.kv_cache_report_mode = kv_cache_report_mode
        self.session_id = session_id  # reported in its BlockStored events
        # Lookups find no hit (vLLM sets it for prompt logprobs); the blocks still cache.
        self.skip_reading_prefix_cache = False
        self.mm_features: tuple[MultiModalFeature, ...] = tuple(
            sorted((MultiModalFeature(*f) for f in mm_features), key=lambda f: f.offset)
        )
        self.plain = (
            self.lora is None and not cache_salt and not self.mm_features and prompt_embeds is None
        )
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # the latest admission's hit (-1: no lookup yet)
        self.num_preemptions = 0
        self.shared_prefix_boundary = 0  # a longer prefix some group had cached (0: none)
        self.block_hashes: list[BlockHash] = []
        self.hasher: BlockHasher | None = None
        if hasher is not None:
            self.set_hasher(hasher)

    def set_lora(self, lora: Any) -> None:
        """Change the LoRA adapter (a ``LoRA``, an object with vLLM's ``LoRARequest``
        fields, or None): blocks hashed from now on carry its key."""
        if lora is not None and not isinstance(lora, LoRA):
            lora = LoRA(lora.lora_name, lora.lora_int_id, lora.lora_path)
        self.lora = lora
        self.plain = (
            lora is None
            and not self.cache_salt
            and not self.mm_features
            and self.prompt_embeds is None
        )

    @property
    def lora_name(self) -> str | None:
        return None if self.lora is None else self.lora.name

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    def set_hasher(self, hasher: BlockHasher) -> None:
        """Attach ``hasher`` and hash every full block so far (from scratch if it changed)."""
        if self.hasher is not hasher:
            self.block_hashes = []
        self.hasher = hasher
        self.block_hashes.extend(hasher(self))

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append generated tokens; newly full blocks are hashed now."""
        if isinstance(token_ids, int):
            self.all_token_ids.append(token_ids)
        else:
            self.all_token_ids.extend(token_ids)
        hasher = self.hasher
        if hasher is not None:
            new = hasher(self)
            if new:
                self.block_hashes.extend(new)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )
