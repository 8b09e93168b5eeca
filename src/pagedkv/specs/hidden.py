"""Hidden-state cache layers: a model's hidden states stored like an MLA latent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagedkv.specs.full import MLAAttentionSpec

__all__ = [
    "HiddenStateCacheSpec",
]


@dataclass(frozen=True, kw_only=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """One hidden-state vector (``num_kv_heads * head_size`` values) per token, kept for
    a consumer that extracts them (vLLM's extract_hidden_states). Sized and managed as
    full attention, but planned apart: each such layer gets a group of its own."""

    kind: ClassVar[str] = "hidden_state_cache"

    @property
    def vllm_kind(self) -> str:
        return "mla_attention"

    @property
    def per_token_bytes(self) -> int:
        """Bytes one token's hidden state takes (what the planner fits into a page)."""
        return self.bytes_per_token
