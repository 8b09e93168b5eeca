"""HiSparse's GPU-side groups: a per-request hot region and reclaimable resident pages.
The history itself lives in a host pool that HiSparse's coordinator owns; these specs
size only what stays on the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pagedkv.specs.base import KVCacheSpec, cdiv, check_fields

__all__ = [
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


@dataclass(frozen=True, kw_only=True)
class HiSparseHotSpec(KVCacheSpec):
    """A request's hot region: ``blocks_per_request`` pages of ``page_size`` bytes, taken
    only once the request reads host-backed history, never prefix-cached."""

    page_size: int
    blocks_per_request: int

    kind: ClassVar[str] = "hisparse_hot"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "page_size", "blocks_per_request")

    @property
    def page_size_bytes(self) -> int:
        return self.page_size

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def vllm_kind(self) -> str:
        return "unknown"

    @property
    def disables_prefix_caching(self) -> bool:
        return False

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return self.blocks_per_request * self.page_size

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        return self.blocks_per_request


@dataclass(frozen=True, kw_only=True)
class HiSparseResidentSpec(KVCacheSpec):
    """Pages of ``page_size`` bytes for the tokens in flight; older pages may live only
    on the host (null entries). Never prefix-cached."""

    page_size: int

    kind: ClassVar[str] = "hisparse_resident"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "page_size")

    @property
    def page_size_bytes(self) -> int:
        return self.page_size

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def vllm_kind(self) -> str:
        return "unknown"

    @property
    def disables_prefix_caching(self) -> bool:
        return False

    def max_admission_blocks_per_request(self, in_flight_tokens: int, max_model_len: int) -> int:
        """Resident pages a request holds at once: those of its in-flight tokens."""
        return cdiv(min(in_flight_tokens, max_model_len), self.block_size)

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        blocks = self.max_admission_blocks_per_request(
            config.max_in_flight_tokens, config.max_model_len
        )
        return blocks * self.page_size
