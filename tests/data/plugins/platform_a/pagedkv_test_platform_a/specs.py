from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagedkv.specs import FullAttentionSpec


@dataclass(frozen=True, kw_only=True)
class PlatformAFullSpec(FullAttentionSpec):
    """Full attention with a per-block header of ``header_bytes`` (e.g. a checksum)."""

    header_bytes: int = 64

    kind: ClassVar[str] = "platform_a_full_attention"

    @property
    def real_page_size_bytes(self) -> int:
        return super().real_page_size_bytes + self.header_bytes


@dataclass(frozen=True, kw_only=True)
class PluginRingSpec(FullAttentionSpec):
    """A kind registered by platform A's general plugin, as its own uniform base."""

    kind: ClassVar[str] = "plugin_ring"
