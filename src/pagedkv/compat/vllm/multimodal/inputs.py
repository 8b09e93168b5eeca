"""vLLM's ``vllm.multimodal.inputs``: where a multimodal item sits in a prompt and its
identifier; pagedkv's block hashes read those, never the data."""

from __future__ import annotations

from collections import UserDict
from dataclasses import dataclass
from typing import Any

__all__ = ["MultiModalFeatureSpec", "MultiModalKwargsItem", "PlaceholderRange"]


@dataclass(frozen=True)
class PlaceholderRange:
    offset: int
    length: int
    is_embed: Any = None


class MultiModalKwargsItem(UserDict[str, Any]):
    """An item's processed inputs (opaque to the KV cache)."""

    @staticmethod
    def dummy(nbytes: int = 1) -> MultiModalKwargsItem:
        return MultiModalKwargsItem({"dummy": bytes(nbytes)})


@dataclass
class MultiModalFeatureSpec:
    data: MultiModalKwargsItem | None
    modality: str
    identifier: str
    mm_position: PlaceholderRange
    mm_hash: str | None = None
