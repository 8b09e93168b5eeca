"""Micro-benchmarks of the KVCacheManager hot path.

Each case is timed over many calls, repeated; the JSON gives the median nanoseconds per
call, calls per second, and the ratio to a reference run in the same process (a bound
method call that looks a key up in a dict: the cheapest thing a manager call could be),
so figures from a loaded machine can still be compared. The cyclic garbage collector is
paused while a case runs.

Cases, for a Llama-like layout (one full-attention group, 16-token blocks) and a
Gemma-like hybrid (five sliding-window groups, window 1024, plus one full group) and,
with ``--layouts gemma31``, many identical groups (26 window groups + 5 full groups, as a
planner may lay out gemma-3-27b with two layers per group):
``decode``: allocate_slots for one decode token (16 in a row, so one in 16 crosses a
block boundary: allocation and caching included); ``lookup``: get_computed_blocks of a
2,048-token prompt fully cached; ``admit_free``: adopting that hit, allocating the
rest and freeing the request; ``free``: freeing a 2,048-token request; ``prefill``:
per block, 2,048-token chunks of 8,192-token prompts and their free, with every free
block cached first (each new block evicts a cached one).

    python benchmarks/bench_hot_path.py [--repeat R] [--layouts llama,gemma]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

from pagedkv import (
    EngineConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from pagedkv.runtime import KVCacheManager, Request

PROMPT_TOKENS = 2048


def _manager(layout: str) -> KVCacheManager:
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128)
    specs: list[KVCacheSpec] = [full]
    window = SlidingWindowSpec(block_size=16, num_kv_heads=16, head_size=128, sliding_window=1024)
    if layout == "gemma":
        specs = [window] * 5 + [full]
    elif layout == "gemma31":
        specs = [window] * 26 + [full] * 5
    groups = tuple(
        KVCacheGroupSpec(layer_names=(f"layer{i}",), kv_cache_spec=s) for i, s in enumerate(specs)
    )
    kv = KVCacheConfig(
        num_blocks=200_000, kv_cache_tensors=(), kv_cache_groups=groups, max_model_len=1 << 20
    )
    config = EngineConfig.create(max_model_len=1 << 20, block_size=16)
    return KVCacheManager(kv, config, hash_algo="builtin")


def _seed(rid: str) -> int:
    """A prompt seed from the request id, the same in every process (``hash`` of a str
    is salted per process, which changed which requests shared prompts run to run)."""
    return zlib.crc32(rid.encode()) % 1000


def _prompt(seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 32000 for i in range(PROMPT_TOKENS)]


def _running(manager: KVCacheManager, rid: str) -> Request:
    req = Request(rid, _prompt(_seed(rid)))
    hit, num_hit = manager.get_computed_blocks(req)
    manager.allocate_slots(req, PROMPT_TOKENS - num_hit, num_hit, hit)
    req.num_computed_tokens = PROMPT_TOKENS
    return req


def case_decode(manager: KVCacheManager, n: int) -> float:
    reqs = [_running(manager, f"d{i}") for i in range(n // 16 + 1)]
    elapsed = 0.0
    allocate = manager.allocate_slots
    perf = time.perf_counter
    for req in reqs:
        for t in range(16):
            req.append_output_token_ids(t)
            start = perf()
            allocate(req, 1)
            elapsed += perf() - start
            req.num_computed_tokens += 1
    for req in reqs:
        manager.free(req)
    return elapsed / (len(reqs) * 16)


def case_lookup(manager: KVCacheManager, n: int) -> float:
    manager.free(_running(manager, "seed"))
    reqs = [Request(f"l{i}", [*_prompt(_seed("seed")), 1]) for i in range(n)]
    for req in reqs:
        req.set_hasher(manager.hasher)
    lookup = manager.get_computed_blocks
    start = time.perf_counter()
    for req in reqs:
        lookup(req)
    return (time.perf_counter() - start) / n


def case_admit_free(manager: KVCacheManager, n: int) -> float:
    manager.free(_running(manager, "seed"))
    reqs = [Request(f"a{i}", [*_prompt(_seed("seed")), 1, 2, 3]) for i in range(n)]
    elapsed = 0.0
    perf = time.perf_counter
    for req in reqs:
        req.set_hasher(manager.hasher)
        hit, num_hit = manager.get_computed_blocks(req)
        start = perf()
        manager.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit)
        manager.free(req)
        elapsed += perf() - start
    return elapsed / n


def case_free(manager: KVCacheManager, n: int) -> float:
    reqs = [_running(manager, f"f{i}") for i in range(n)]
    start = time.perf_counter()
    for req in reqs:
        manager.free(req)
    return (time.perf_counter() - start) / n


def case_prefill(manager: KVCacheManager, n: int) -> float:
    """Per block: 2,048-token prefill chunks of new prompts, then their free, once every
    free block is cached (each new block evicts one, as on a busy server)."""
    pool = manager.block_pool
    warm: list[Request] = []
    while pool.num_free_blocks > 64 * manager.num_groups:
        num_tokens = min(pool.num_free_blocks // manager.num_groups * 16 - 512, 1 << 19)
        req = Request(f"warm{len(warm)}", [len(warm), *range(num_tokens - 1)])
        manager.allocate_slots(req, num_tokens)
        warm.append(req)
    for req in warm:
        manager.free(req)
    reqs = [Request(f"p{i}", _prompt(_seed(f"p{i}")) * 4) for i in range(n)]
    elapsed = 0.0
    perf = time.perf_counter
    for req in reqs:
        req.set_hasher(manager.hasher)
        start = perf()
        while req.num_computed_tokens < req.num_tokens:
            manager.allocate_slots(req, PROMPT_TOKENS)
            req.num_computed_tokens += PROMPT_TOKENS
        manager.free(req)
        elapsed += perf() - start
    return elapsed / (n * 4 * PROMPT_TOKENS // 16)


def _timed(fn: Callable[[KVCacheManager, int], float], layout: str, n: int) -> float:
    """Nanoseconds per call of one case on a fresh manager, with the cyclic GC paused (as
    engines freeze it after start-up) so a collection does not land in one call."""
    manager = _manager(layout)
    gc.collect()
    gc.disable()
    try:
        return fn(manager, n) * 1e9
    finally:
        gc.enable()


def reference(n: int) -> float:
    table = {"a": [1]}
    get = table.get
    start = time.perf_counter()
    for _ in range(n):
        get("a")
    return (time.perf_counter() - start) / n


CASES: dict[str, tuple[Callable[[KVCacheManager, int], float], int]] = {
    "decode": (case_decode, 4000),
    "lookup": (case_lookup, 300),
    "admit_free": (case_admit_free, 200),
    "free": (case_free, 100),
    "prefill": (case_prefill, 30),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layouts", default="llama,gemma")
    args = ap.parse_args(argv)
    ref_ns = statistics.median(reference(200_000) for _ in range(args.repeat)) * 1e9
    out: dict[str, Any] = {"reference_ns_per_call": round(ref_ns, 1), "layouts": {}}
    for layout in args.layouts.split(","):
        results = {}
        for name, (fn, n) in CASES.items():
            runs = [_timed(fn, layout, n) for _ in range(args.repeat)]
            ns = statistics.median(runs)
            results[name] = {
                "ns_per_call_median": round(ns, 1),
                "calls_per_second": round(1e9 / ns),
                "ratio_to_reference": round(ns / ref_ns, 2),
                "runs_ns": [round(r, 1) for r in runs],
            }
        out["layouts"][layout] = results
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
