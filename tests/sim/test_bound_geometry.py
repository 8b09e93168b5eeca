"""The bound's cache size comes from the planner's capacity and ignores group order."""

from __future__ import annotations

from pagedkv.capacity.plan import full_attention_token_capacity
from pagedkv.config import EngineConfig
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.sim import SchedulerSettings, SimSetup, simulate
from pagedkv.sim.setup import bound_geometry
from pagedkv.specs import FullAttentionSpec, SlidingWindowSpec

from .helpers import make_trace


def _group(name: str, block_size: int, window: int | None = None) -> KVCacheGroupSpec:
    if window is None:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8)
    else:
        spec = SlidingWindowSpec(
            block_size=block_size, num_kv_heads=1, head_size=8, sliding_window=window
        )
    return KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=spec)


def _config(groups: list[KVCacheGroupSpec], num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=tuple(groups), max_model_len=512
    )


def test_two_full_groups_give_the_same_bound_in_either_order():
    small, large = _group("a", 16), _group("b", 32)
    forward = bound_geometry(_config([small, large], 300))
    backward = bound_geometry(_config([large, small], 300))
    assert forward == backward
    tokens = full_attention_token_capacity((small, large), 300)
    assert tokens == 3189  # 299 blocks / (1/16 + 1/32) tokens per block
    assert forward == (16, tokens // 16)


def test_single_full_group_and_hybrid_keep_num_blocks_minus_one():
    assert bound_geometry(_config([_group("a", 16)], 300)) == (16, 299)
    hybrid = [_group("w", 16, window=64), _group("a", 16)]
    assert bound_geometry(_config(hybrid, 300)) == (16, 299)
    assert bound_geometry(_config([_group("w", 16, window=64)], 300)) is None


def test_simulated_bound_does_not_depend_on_group_order():
    shared = [(((i % 3, 48), (10 + i, 20)), 3) for i in range(12)]
    trace = make_trace(*shared)
    settings = SchedulerSettings(max_num_seqs=4, max_num_batched_tokens=512)
    config = EngineConfig.create(block_size=4, max_model_len=512)
    rates = []
    for order in ((4, 8), (8, 4)):
        groups = [_group(f"l{i}", bs) for i, bs in enumerate(order)]
        setup = SimSetup(kv_cache_config=_config(groups, 40), config=config)
        result = simulate(setup, trace, settings, bound=True)
        assert result.bound_hit_rate >= result.hit_rate
        rates.append((result.hit_rate, result.bound_hit_rate))
    assert rates[0] == rates[1]
    assert rates[0][1] > 0
