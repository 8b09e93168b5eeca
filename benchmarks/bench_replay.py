"""Replay the bundled Mooncake conversation trace through KVCacheManager and print JSON.

Layouts match the vLLM peer's neutral model files (../shared/tools/vllm_peer/models):
``llama``: 32 full-attention layers (8 KV heads x 128, bf16), 10,240 blocks of 16 tokens
(what vLLM plans for 20 GiB); ``gemma``: a Gemma-3-27B-like hybrid, 52 sliding-window
layers (window 1024) in six groups (9, 9, 9, 9, 8, 8 layers) plus one group of 10 full
layers, 16,384 blocks (vLLM's grouping and block count at 20 GiB). The loop is the one
`pagedkv simulate` uses, step for step the peer's replay.py: 64 running requests,
2048-token chunks, 8192 tokens per step, every request waiting at t=0.

Manager time is perf_counter around manager calls only; request time (token ids and
block hashes) is apart, as the peer's request_hash_seconds; the simulator overhead is
what is left of the wall time. ``--vllm-json layout=FILE`` adds ratios against a peer
replay.py result on the same trace and block count.

    python benchmarks/bench_replay.py [--layouts llama,gemma] [--limit N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from pagedkv.config import EngineConfig
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.sim.run import simulate
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.bundled import load_trace
from pagedkv.specs import FullAttentionSpec, SlidingWindowSpec

# The vLLM peer replay's loop (../shared/tools/vllm_peer/replay.py): 64 running requests,
# 2,048-token chunks, 8,192 tokens a step, every request waiting at t=0.
PEER_SETTINGS = SchedulerSettings(
    max_num_seqs=64, max_num_batched_tokens=8192, max_prefill_chunk=2048, arrivals="all"
)

MAX_MODEL_LEN = 131072


def _llama() -> SimSetup:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128)
    layers = tuple(f"model.layers.{i}.self_attn" for i in range(32))
    return _setup("llama-3.1-8b", 10240, [KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)])


def _gemma() -> SimSetup:
    full = FullAttentionSpec(block_size=16, num_kv_heads=16, head_size=128)
    window = SlidingWindowSpec(block_size=16, num_kv_heads=16, head_size=128, sliding_window=1024)
    names = [f"model.layers.{i}.self_attn" for i in range(62)]
    full_layers = tuple(n for i, n in enumerate(names) if i % 6 == 5)
    window_layers = [n for i, n in enumerate(names) if i % 6 != 5]
    groups = [
        KVCacheGroupSpec(layer_names=tuple(window_layers[g::6]), kv_cache_spec=window)
        for g in range(6)
    ]
    groups.append(KVCacheGroupSpec(layer_names=full_layers, kv_cache_spec=full))
    return _setup("gemma-3-27b-like", 16384, groups)


def _setup(name: str, num_blocks: int, groups: list[KVCacheGroupSpec]) -> SimSetup:
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=(),
        kv_cache_groups=tuple(groups),
        max_model_len=MAX_MODEL_LEN,
    )
    config = EngineConfig.create(block_size=16, max_model_len=MAX_MODEL_LEN)
    return SimSetup(kv_cache_config=cfg, config=config, model_name=name, hash_algo="builtin")


LAYOUTS = {"llama": _llama, "gemma": _gemma}


def _one(setup: SimSetup, limit: int | None) -> dict[str, Any]:
    trace = load_trace("mooncake_conversation").head(limit)
    res = simulate(setup, trace, PEER_SETTINGS)
    overhead = res.overhead_seconds
    return {
        "wall_seconds": round(res.wall_seconds, 3),
        "manager_seconds": round(res.manager_seconds, 3),
        "request_seconds": round(res.request_seconds, 3),
        "simulator_overhead_seconds": round(overhead, 3),
        "overhead_to_manager": round(overhead / res.manager_seconds, 3),
        "manager_calls": res.manager_calls,
        "manager_calls_by_kind": res.manager_calls_by_kind,
        "manager_calls_per_second": round(res.manager_calls / res.manager_seconds, 1),
        "tokens_per_second": round(res.computed_tokens / res.wall_seconds, 1),
        "requests_per_second": round(res.requests_done / res.wall_seconds, 2),
        "requests_done": res.requests_done,
        "prompt_tokens": res.prompt_tokens,
        "prefix_hit_tokens": res.hit_tokens,
        "prefix_hit_rate": round(res.hit_rate, 6),
        "preemptions": res.preemptions,
        "steps": res.steps,
        "allocate_slots_failed": res.allocate_slots_failed,
    }


def _compare(ours: dict[str, Any], path: str) -> dict[str, Any]:
    with open(path) as f:
        peer = json.load(f)
    return {
        "vllm_file": path,
        "vllm_manager_calls_per_second": peer["manager_calls_per_second"],
        "vllm_manager_seconds": peer["manager_seconds"],
        "calls_per_second_ratio": round(
            ours["manager_calls_per_second"] / peer["manager_calls_per_second"], 3
        ),
        "same_prefix_hit_tokens": ours["prefix_hit_tokens"] == peer["prefix_hit_tokens"],
        "vllm_prefix_hit_tokens": peer["prefix_hit_tokens"],
        "same_preemptions": ours["preemptions"] == peer["preemptions"],
        "same_steps": ours["steps"] == peer["steps"],
        "same_manager_calls": ours["manager_calls_by_kind"] == peer["manager_calls"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="llama,gemma")
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--repeat", type=int, default=1, help="runs per layout (median)")
    ap.add_argument("--vllm-json", action="append", default=[], metavar="LAYOUT=FILE")
    args = ap.parse_args(argv)
    peers = dict(item.split("=", 1) for item in args.vllm_json)
    out: dict[str, Any] = {"trace": "mooncake_conversation", "limit": args.limit, "layouts": {}}
    for name in args.layouts.split(","):
        setup = LAYOUTS[name]()
        runs = [_one(setup, args.limit) for _ in range(args.repeat)]
        best = sorted(runs, key=lambda r: r["manager_seconds"])[len(runs) // 2]
        best["num_blocks"] = setup.num_blocks
        best["manager_seconds_runs"] = [r["manager_seconds"] for r in runs]
        best["manager_seconds_median"] = statistics.median(best["manager_seconds_runs"])
        if name in peers:
            best["vs_vllm"] = _compare(best, peers[name])
        out["layouts"][name] = best
        print(json.dumps({name: best}), file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
