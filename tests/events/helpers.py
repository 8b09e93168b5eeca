"""Small managers and streams for the event tests."""

from __future__ import annotations

import random
import socket

from pagedkv import (
    EngineConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
)
from pagedkv.events.wire import external_block_hash
from pagedkv.runtime.events import KVCacheEvent

LOOPBACK = "tcp://127.0.0.1:*"


def free_port() -> int:
    """A loopback TCP port nothing listened on a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def small_manager(num_blocks: int = 24, block_size: int = 4) -> KVCacheManager:
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8)
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=(),
        kv_cache_groups=(KVCacheGroupSpec(layer_names=("layer0",), kv_cache_spec=spec),),
        max_model_len=256,
    )
    engine_config = EngineConfig.create(max_model_len=256, max_num_batched_tokens=256)
    return KVCacheManager(config, engine_config, enable_events=True)


def drive(manager: KVCacheManager, num_requests: int, seed: int = 0) -> list[list[KVCacheEvent]]:
    """Run requests with shared prefixes through ``manager``; one event batch per request."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(12)] for _ in range(4)]
    batches = []
    for i in range(num_requests):
        tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(1, 14))]
        req = Request(f"r{i}", tokens)
        hit, num_hit = manager.get_computed_blocks(req)
        if manager.allocate_slots(req, len(tokens) - num_hit, num_hit, hit) is not None:
            req.num_computed_tokens = len(tokens)
            manager.free(req)
        batches.append(manager.take_events())
    return batches


def cached_hashes(manager: KVCacheManager) -> set[int]:
    """External (64-bit) hashes of every block the manager holds cached."""
    return {external_block_hash(h) for h in manager.block_pool.block_hash if h is not None}
