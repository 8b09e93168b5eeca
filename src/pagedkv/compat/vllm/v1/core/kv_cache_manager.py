"""vLLM's ``vllm.v1.core.kv_cache_manager`` over pagedkv's ``KVCacheManager``: the same
manager, called with vLLM's arguments and answering in vLLM's block objects."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv.compat.vllm.v1.core._dcp import dcp_kv_cache_config
from pagedkv.compat.vllm.v1.core.block_pool import BlockPool
from pagedkv.compat.vllm.v1.core.kv_cache_coordinator import coordinator_class
from pagedkv.compat.vllm.v1.core.kv_cache_utils import (
    KVCacheBlock,
    KVCacheBlockCopy,
    trim_null_head,
)
from pagedkv.compat.vllm.v1.request import Request
from pagedkv.config import EngineConfig
from pagedkv.runtime import kv_cache_manager as _kvm
from pagedkv.runtime.blocks import KVCacheBlocks as _IdBlocks
from pagedkv.runtime.events import BlockStored, KVCacheEvent
from pagedkv.runtime.stats import PrefixCacheStats
from pagedkv.specs import MambaSpec

__all__ = ["KVCacheBlocks", "KVCacheManager", "Request"]

logger = logging.getLogger(__name__)


@dataclass
class KVCacheBlocks:
    """Blocks per KV cache group, as block objects."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([*a, *b] for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        groups = self.blocks if group_ids is None else tuple(self.blocks[g] for g in group_ids)
        if allow_none and all(len(g) == 0 for g in groups):
            return None
        return tuple([b.block_id for b in g] for g in groups)

    def get_unhashed_block_ids(self) -> list[int]:
        if len(self.blocks) != 1:
            raise AssertionError("Only one group is supported")
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [
            [b.block_id for b in trim_null_head(g) if b.block_hash is None and not b.is_null]
            for g in self.blocks
        ]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self.blocks))


class KVCacheManager:
    """vLLM's KVCacheManager API; ``impl`` is the pagedkv manager doing the work."""

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int | None = None,
        hash_block_size: int | None = None,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        if pcp_world_size > 1:
            raise NotImplementedError("prefill context parallelism (pcp) needs pagedkv support")
        self.dcp_world_size = dcp_world_size
        runtime_config = dcp_kv_cache_config(kv_cache_config, dcp_world_size)
        options = _optional_options(
            use_eagle=use_eagle,
            # vLLM takes any int, a bool included (its tests pass one)
            num_hash_lookahead_tokens=int(num_hash_lookahead_tokens),
            num_prefill_lookahead=num_prefill_lookahead,
            enable_mamba_shared_prefix_checkpoint=enable_mamba_shared_prefix_checkpoint,
        )
        if dcp_world_size > 1:
            options["dcp_world_size"] = dcp_world_size
        self.max_model_len = max_model_len
        in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        config = EngineConfig.create(
            max_model_len=max_model_len, max_num_batched_tokens=max(in_flight, 1)
        )
        interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
        validate_retention_interval(interval, scheduler_block_size, kv_cache_config)
        self.impl = _kvm.KVCacheManager(
            runtime_config,
            config,
            enable_caching=enable_caching,
            enable_events=enable_kv_cache_events,
            watermark=watermark,
            hash_block_size=hash_block_size if len(runtime_config.kv_cache_groups) > 1 else None,
            prefix_cache_retention_interval=interval,
            **options,
        )
        self.kv_cache_config = kv_cache_config
        self.enable_caching = self.impl.enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.scheduler_block_size = scheduler_block_size or self.impl.scheduler_block_size
        self.hash_block_size = hash_block_size or self.impl.hash_block_size
        # vLLM always records Mamba align boundary states for a KV connector to drain.
        self.impl.offer_boundary_states()
        self.block_pool = BlockPool(
            0, False, 0, metrics_collector=metrics_collector, impl=self.impl.block_pool
        )
        self.block_pool.table_owners = self.impl.managers
        coordinator = coordinator_class(self.enable_caching, self.num_kv_cache_groups)
        self.coordinator = coordinator(
            self.impl.coordinator,
            self.block_pool,
            kv_cache_config,
            self.scheduler_block_size,
            interval,
            use_eagle,
            dcp_world_size,
        )
        self.coordinator.on_retention_change = self.impl.set_prefix_cache_retention_interval
        self.coordinator.enable_partial_hash_hits = bool(
            getattr(self.impl, "enable_partial_hash_hits", False)
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups))
        )
        self._stats_base = self.impl.make_prefix_cache_stats()

    @property
    def usage(self) -> float:
        return self.impl.usage

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self.impl.prefix_cache_stats if self.log_stats else None

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        stats = self.impl.make_prefix_cache_stats()
        return stats if self.log_stats else None

    def _blocks(self, ids: Sequence[Sequence[int]]) -> KVCacheBlocks:
        if not any(ids):
            return self.empty_kv_cache_blocks
        managers = self.coordinator.single_type_managers  # a group may have its own pool
        return KVCacheBlocks(tuple(m.block_pool.ids_to_blocks(g) for m, g in zip(managers, ids)))

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def _adopt_hasher(self, request: Request) -> None:
        hasher = request.hasher
        impl = self.impl
        if (
            hasher is not None
            and hasher is not impl.hasher
            and hasher.block_size == impl.hash_block_size
        ):
            impl.hasher = hasher

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        self._adopt_hasher(request)
        if max_cache_hit_length is not None:
            raise NotImplementedError("max_cache_hit_length needs pagedkv support")
        pinned = request.shared_prefix_boundary
        blocks, num_tokens = self.impl.get_computed_blocks(request)
        # vLLM's lookup reports the shared-prefix junction (on a miss too) and its caller
        # decides whether the request keeps it; pagedkv's keeps it at once.
        boundary = request.shared_prefix_boundary
        request.shared_prefix_boundary = pinned
        if not num_tokens:
            return self.empty_kv_cache_blocks, 0, boundary
        return self._blocks(blocks.blocks), num_tokens, boundary

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        self._adopt_hasher(request)
        hits = None
        if new_computed_blocks is not None:
            hits = _IdBlocks(tuple(_ids(g) for g in new_computed_blocks.blocks))
        new = self.impl.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            num_lookahead_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            has_scheduled_reqs=has_scheduled_reqs,
            reserved_blocks=reserved_blocks,
            num_external_computed_tokens=num_external_computed_tokens,
        )
        return None if new is None else self._blocks(new.blocks)

    def free(self, request: Request) -> None:
        self.impl.free(request)

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """The request's blocks (allocation order, every group) with its bookkeeping gone;
        the caller frees them through the block pool."""
        blocks: list[KVCacheBlock] = []
        for manager in self.coordinator.single_type_managers:
            blocks.extend(manager.pop_blocks_for_free(request.request_id))
        return blocks

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        self.impl.remove_skipped_blocks(request_id, processed_computed_tokens)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.impl.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[KVCacheEvent]:
        """pagedkv's events; a BlockStored naming a group this model lacks is logged."""
        events = self.impl.take_events()
        num_groups = self.num_kv_cache_groups
        for event in events:
            gid = getattr(event, "group_idx", None)
            if isinstance(event, BlockStored) and gid is not None and not 0 <= gid < num_groups:
                logger.warning("Group index `%s` not in KV cache metadata", gid)
        return events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._blocks(self.impl.get_block_ids(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.impl.get_block_ids(request_id)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.impl.cache_blocks(request, num_computed_tokens)

    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        """A lookup result cut at ``num_computed_tokens`` (aligned); a Mamba group keeps
        what it has up to there; groups that cache nothing stay empty."""
        cut: list[list[KVCacheBlock]] = []
        for group_blocks, manager in zip(
            blocks.blocks, self.coordinator.single_type_managers, strict=True
        ):
            if not manager.kv_cache_spec.prefix_cacheable:
                cut.append([])
                continue
            if num_computed_tokens % manager.block_size:
                raise AssertionError(
                    f"{num_computed_tokens} tokens is not a multiple of block size "
                    f"{manager.block_size}"
                )
            num_blocks = num_computed_tokens // manager.block_size
            # An external state may stand in for a short Mamba hit; others must cover it.
            if num_blocks > len(group_blocks) and not isinstance(manager.kv_cache_spec, MambaSpec):
                raise AssertionError(
                    f"{num_computed_tokens} tokens is past the group's "
                    f"{len(group_blocks)} hit blocks of {manager.block_size} tokens"
                )
            cut.append(list(group_blocks[:num_blocks]))
        return self.create_kv_cache_blocks(tuple(cut))

    def take_kv_cache_block_copies(self) -> tuple[list[KVCacheBlockCopy], list[KVCacheBlock]]:
        """Copy-on-write copies queued by partial prefix hits and the blocks they keep
        referenced (release those with ``block_pool.free_blocks`` after copying)."""
        copies, retained = self.impl.take_kv_cache_block_copies()
        return (
            [KVCacheBlockCopy(c.src_block_id, c.dst_block_id) for c in copies],
            self.block_pool.ids_to_blocks(retained),
        )

    def new_step_starts(self) -> None:
        self.impl.new_step_starts()

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """``{request_id: [(group_id, block_id, boundary_tokens), ...]}`` keyed since the
        last call (Mamba align groups)."""
        return self.impl.take_boundary_state_offloads()

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        return self.impl.finalize_partial_tail_offloads(
            request.request_id,
            request.num_computed_tokens,
            getattr(request, "num_in_flight_tokens", 0),
        )


def _optional_options(**options: Any) -> dict[str, Any]:
    """vLLM options pagedkv's manager takes under the same name; set ones it lacks raise."""
    accepted = inspect.signature(_kvm.KVCacheManager).parameters
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name in accepted:
            out[name] = value
        elif value:
            raise NotImplementedError(f"KVCacheManager({name}=...) needs pagedkv support")
    return out


def _ids(blocks: Sequence[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def validate_retention_interval(
    interval: int | None, scheduler_block_size: int | None, kv_cache_config: Any
) -> None:
    """vLLM's check: a positive interval needs a sliding-window or Mamba group and must be a
    multiple of the scheduler block size."""
    if interval is None:
        return
    from pagedkv.specs import SlidingWindowSpec

    groups = kv_cache_config.kv_cache_groups
    if not any(isinstance(g.kv_cache_spec, SlidingWindowSpec | MambaSpec) for g in groups):
        if interval == 0:
            return
        raise ValueError(
            "prefix_cache_retention_interval is set but this model has no sliding-window "
            "or Mamba KV cache group, so retention has no effect"
        )
    step = scheduler_block_size or math.lcm(*(g.kv_cache_spec.block_size for g in groups))
    if interval < 0 or interval % step:
        raise ValueError(
            f"prefix_cache_retention_interval ({interval}) must be non-negative and a "
            f"multiple of scheduler_block_size ({step})."
        )
