"""Cost of each eviction policy per manager call, LRU's beside it, in one process.

A seeded workload of requests sharing prefixes (a hit, a prefill allocation, decode
steps, a free) runs against a small pool so that most allocations evict. Each policy
replays the same workload; the JSON gives the median seconds over runs, microseconds
per manager call and the ratio to LRU (the runtime's own queue, vLLM's order). Also
per-operation costs of the queues themselves (push, pop with eviction, revive).

    python benchmarks/bench_policies.py [--requests N] [--runs R] [--policies lru,lfu]

Run it with another checkout's ``src`` first on PYTHONPATH to compare LRU across
branches (the workload does not depend on the branch).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from pagedkv import EngineConfig, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from pagedkv.runtime import KVCacheManager, Request

try:  # absent on a checkout without pagedkv.policies (LRU only)
    from pagedkv.policies import make_free_queue, make_kv_cache_manager
except ImportError:  # pragma: no cover - comparison runs against main
    make_kv_cache_manager = None  # type: ignore[assignment]
    make_free_queue = None  # type: ignore[assignment]

BLOCK_SIZE = 16
POLICIES = ["lru", "lfu", "s3fifo", "priority"]


def _workload(num_requests: int, seed: int = 0) -> list[tuple[list[int], int, int]]:
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(50_000) for _ in range(rnd.randrange(64, 1024))] for _ in range(40)]
    out = []
    for _ in range(num_requests):
        prefix = prefixes[min(int(rnd.paretovariate(1.2)) - 1, len(prefixes) - 1)]
        suffix = [rnd.randrange(50_000) for _ in range(rnd.randrange(16, 512))]
        out.append((prefix + suffix, rnd.randrange(1, 64), rnd.randrange(-2, 3)))
    return out


def _manager(policy: str, num_blocks: int) -> Any:
    groups = (
        KVCacheGroupSpec(
            layer_names=("l0",),
            kv_cache_spec=FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=8, head_size=128),
        ),
    )
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=groups)
    config = EngineConfig.create(max_model_len=4096, max_num_batched_tokens=4096)
    if policy == "lru" and make_kv_cache_manager is None:
        return KVCacheManager(kv, config, hash_algo="builtin")
    if policy == "lru":  # the default path, exactly what an engine gets
        return KVCacheManager(kv, config, hash_algo="builtin")
    return make_kv_cache_manager(kv, config, policy=policy, hash_algo="builtin")


def _replay(
    policy: str, work: list[tuple[list[int], int, int]], num_blocks: int
) -> tuple[float, int, int]:
    manager = _manager(policy, num_blocks)
    running: list[Request] = []
    calls = hits = 0
    perf = time.perf_counter
    spent = 0.0
    for i, (tokens, decode, priority) in enumerate(work):
        req = Request(str(i), tokens, priority=priority, hasher=manager.hasher)
        t0 = perf()
        blocks, num_hit = manager.get_computed_blocks(req)
        ok = manager.allocate_slots(req, len(tokens) - num_hit, num_hit, blocks)
        spent += perf() - t0
        calls += 2
        while ok is None and running:
            old = running.pop(0)
            t0 = perf()
            manager.free(old)
            ok = manager.allocate_slots(req, len(tokens) - num_hit, num_hit, blocks)
            spent += perf() - t0
            calls += 2
        if ok is None:
            continue
        hits += num_hit
        req.num_computed_tokens = len(tokens)
        for _ in range(decode):
            req.append_output_token_ids(7)
            t0 = perf()
            ok = manager.allocate_slots(req, 1)
            spent += perf() - t0
            calls += 1
            if ok is None:
                break
            req.num_computed_tokens += 1
        running.append(req)
        if len(running) > 8:
            old = running.pop(0)
            t0 = perf()
            manager.free(old)
            spent += perf() - t0
            calls += 1
    return spent, calls, hits


def _queue_ops(policy: str, num_blocks: int, rounds: int) -> dict[str, float]:
    """Microseconds per push_cached, per pop that evicts, per remove (a revived block)."""
    queue = make_free_queue(policy, num_blocks)
    queue.pop(num_blocks - 1)  # every block in use
    blocks = list(range(1, num_blocks))
    perf = time.perf_counter
    t0 = perf()
    for r in range(rounds):
        for block in blocks:
            queue.push_cached([block], r % 3)
        if r < rounds - 1:
            queue.pop(len(blocks))
    push = perf() - t0
    t0 = perf()
    for block in blocks[::2]:
        queue.remove(block)
    remove = perf() - t0
    t0 = perf()
    queue.pop(len(queue))
    pop = perf() - t0
    n = len(blocks)
    return {
        "push_us": round(1e6 * push / (rounds * n), 3),
        "remove_us": round(1e6 * remove / len(blocks[::2]), 3),
        "pop_us": round(1e6 * pop / (n - len(blocks[::2])), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    args = parser.parse_args()
    work = _workload(args.requests)
    policies = args.policies.split(",") if make_kv_cache_manager is not None else ["lru"]
    times: dict[str, list[float]] = {p: [] for p in policies}
    meta: dict[str, tuple[int, int]] = {}
    for _ in range(args.runs):  # interleaved, so drift on a shared machine hits all alike
        for policy in policies:
            spent, calls, hits = _replay(policy, work, args.blocks)
            times[policy].append(spent)
            meta[policy] = (calls, hits)
    lru = statistics.median(times["lru"])
    out: dict[str, Any] = {
        "requests": args.requests,
        "num_blocks": args.blocks,
        "runs": args.runs,
        "policies": {},
    }
    for policy in policies:
        median = statistics.median(times[policy])
        calls, hits = meta[policy]
        entry: dict[str, Any] = {
            "median_s": round(median, 4),
            "calls": calls,
            "us_per_call": round(1e6 * median / calls, 3),
            "ratio_to_lru": round(median / lru, 3),
            "hit_tokens": hits,
        }
        if make_free_queue is not None:
            entry["queue_ops"] = _queue_ops(policy, 20_000, 3)
        out["policies"][policy] = entry
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
