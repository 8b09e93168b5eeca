"""Benchmarks of the tensors layer, as ratios against a reference run in the same process.

``overlap``: proving a real plan alias-safe with ``find_unsafe_overlaps`` (closed form per
region pair) against the brute-force page sweep it replaced, on planned Llama-3.1-8B and
gemma-2-9b-it caches of ``--blocks`` blocks. ``attention``: the reference
``paged_attention`` (write through slots, gather through block tables) against dense
``attend`` over the same keys, for a batch of decode queries; the ratio is the cost of
paging in plain torch. Medians over ``--repeat`` runs; JSON on stdout.

    python benchmarks/bench_tensors.py [--repeat R] [--blocks N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pagedkv import EngineConfig, get_kv_cache_configs, get_kv_cache_specs, load_model_config
from pagedkv.planning.types import KVCacheConfig
from pagedkv.specs import FullAttentionSpec
from pagedkv.tensors import (
    AttentionWindow,
    ScheduledRequest,
    allocate_kv_cache,
    attend,
    build_attention_metadata,
    find_unsafe_overlaps,
    paged_attention,
    write_kv,
)
from pagedkv.tensors.overlap import sweep_unsafe_overlaps


def median_s(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def planned(model: str, num_blocks: int) -> KVCacheConfig:
    config = EngineConfig.create(
        block_size=16, max_model_len=-1, num_gpu_blocks_override=num_blocks
    )
    specs = get_kv_cache_specs(load_model_config(model), config=config)
    return get_kv_cache_configs(config, specs, [1 << 40] * len(specs))[0]


def bench_overlap(repeat: int, num_blocks: int) -> list[dict[str, Any]]:
    rows = []
    for model in ("Llama-3.1-8B", "gemma-2-9b-it"):
        plan = planned(model, num_blocks)
        fast = median_s(lambda p=plan: find_unsafe_overlaps(p), repeat)
        slow = median_s(lambda p=plan: sweep_unsafe_overlaps(p), max(1, repeat // 3))
        rows.append(
            {
                "case": "overlap",
                "model": model,
                "num_blocks": plan.num_blocks,
                "num_layers": len(plan.layer_names),
                "closed_form_s": fast,
                "sweep_s": slow,
                "speedup": slow / fast,
            }
        )
    return rows


def bench_attention(repeat: int) -> dict[str, Any]:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="float32")
    config = EngineConfig.create(block_size=16, max_model_len=1024, num_gpu_blocks_override=600)
    (plan,) = get_kv_cache_configs(config, [{"layer": spec}], [1 << 30])
    view = allocate_kv_cache(plan)["layer"]
    gen = torch.Generator().manual_seed(0)
    num_requests, context = 16, 512
    blocks = torch.randperm(plan.num_blocks - 1, generator=gen)[: num_requests * 32] + 1
    tables = blocks.view(num_requests, 32).tolist()
    prefill = [ScheduledRequest([t], 0, context) for t in tables]
    (meta,) = build_attention_metadata(prefill, [16])
    keys = torch.randn(num_requests * context, 4, 64, generator=gen)
    values = torch.randn(num_requests * context, 4, 64, generator=gen)
    write_kv(view, meta.slot_mapping, keys, values)
    decode = [ScheduledRequest([t], context - 1, 1) for t in tables]
    (step,) = build_attention_metadata(decode, [16])
    query = torch.randn(num_requests, 8, 64, generator=gen)

    def dense() -> None:
        for r in range(num_requests):
            k = keys[r * context : (r + 1) * context]
            v = values[r * context : (r + 1) * context]
            q_pos = torch.tensor([context - 1])
            attend(query[r : r + 1], k, v, q_pos, torch.arange(context), AttentionWindow())

    paged_s = median_s(lambda: paged_attention(view, query, step), repeat)
    dense_s = median_s(dense, repeat)
    return {
        "case": "attention",
        "num_requests": num_requests,
        "context_tokens": context,
        "paged_s": paged_s,
        "dense_s": dense_s,
        "paged_over_dense": paged_s / dense_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [*bench_overlap(args.repeat, args.blocks), bench_attention(args.repeat)]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
