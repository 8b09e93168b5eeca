from __future__ import annotations

from pagedkv.config import EngineConfig
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.trace import Segment, Trace, TraceRequest
from pagedkv.specs import FullAttentionSpec, SlidingWindowSpec

BS = 4


def make_setup(num_blocks: int, *, window: int | None = None, max_model_len: int = 256):
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8)
    groups = [KVCacheGroupSpec(layer_names=("full.0",), kv_cache_spec=full)]
    if window is not None:
        sw = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, sliding_window=window)
        groups.append(KVCacheGroupSpec(layer_names=("sw.0",), kv_cache_spec=sw))
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=(),
        kv_cache_groups=tuple(groups),
        max_model_len=max_model_len,
    )
    config = EngineConfig.create(block_size=BS, max_model_len=max_model_len)
    return SimSetup(kv_cache_config=cfg, config=config, model_name="tiny")


def make_trace(*requests: tuple[tuple[tuple[int, int], ...], int]) -> Trace:
    reqs = tuple(
        TraceRequest(float(i), tuple(Segment(*s) for s in segs), out, -1 - i)
        for i, (segs, out) in enumerate(requests)
    )
    return Trace("hand", reqs)
