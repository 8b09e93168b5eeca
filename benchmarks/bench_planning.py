"""Planning speed: a 1,000-layer hybrid across 64 workers (TP 8 x PP 8), with vLLM's
grouping (the default) and with the least-waste opt-in.

Prints JSON: median seconds over runs for each scenario, and the ratio of each to a
reference run in the same process (a 1,000-layer dense model on one worker).
Usage: python benchmarks/bench_planning.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from pagedkv import (
    EngineConfig,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    plan_kv_cache,
)

GiB = 1 << 30
NUM_LAYERS = 1000
TP, PP = 8, 8


def full(heads: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=128)


def sliding_hybrid(heads: int) -> dict[str, KVCacheSpec]:
    """5 sliding-window layers to 1 full layer (Gemma-3 style)."""
    window = SlidingWindowSpec(
        block_size=16, num_kv_heads=heads, head_size=128, sliding_window=1024
    )
    return {f"layers.{i}": full(heads) if (i + 1) % 6 == 0 else window for i in range(NUM_LAYERS)}


def mamba_hybrid(heads: int) -> dict[str, KVCacheSpec]:
    """3 Mamba layers to 1 full layer (Qwen3-Next / Jamba style)."""
    state = MambaSpec(
        block_size=16,
        shapes=((1024, 3), (1024, 16)),
        dtypes=("bfloat16", "bfloat16"),
        mamba_cache_mode="align",
    )
    return {f"layers.{i}": full(heads) if i % 4 == 3 else state for i in range(NUM_LAYERS)}


def split(specs: dict[str, KVCacheSpec], tp: int, pp: int) -> list[dict[str, KVCacheSpec]]:
    """Per-worker dicts, pp-major (worker = pp_rank * tp + tp_rank), contiguous stages."""
    names = list(specs)
    per_stage = -(-len(names) // pp)
    stages = [names[i * per_stage : (i + 1) * per_stage] for i in range(pp)]
    return [{n: specs[n] for n in stage} for stage in stages for _ in range(tp)]


def timed(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up (imports, lazy registry)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    config = EngineConfig.create(
        max_model_len=131072, tensor_parallel_size=TP, pipeline_parallel_size=PP
    )
    searched = config.replace(kv_cache_grouping_rule="least-waste")
    dense = {f"layers.{i}": full(8) for i in range(NUM_LAYERS)}
    reference_config = EngineConfig.create(max_model_len=131072)
    scenarios: dict[str, Callable[[], object]] = {
        "reference_dense_1_worker": lambda: plan_kv_cache(reference_config, [dense], [640 * GiB]),
        "sliding_hybrid_64_workers": lambda: plan_kv_cache(
            config, split(sliding_hybrid(2), TP, PP), [80 * GiB] * (TP * PP)
        ),
        "mamba_hybrid_64_workers": lambda: plan_kv_cache(
            config, split(mamba_hybrid(2), TP, PP), [80 * GiB] * (TP * PP)
        ),
        "sliding_hybrid_64_workers_least_waste": lambda: plan_kv_cache(
            searched, split(sliding_hybrid(2), TP, PP), [80 * GiB] * (TP * PP)
        ),
        "mamba_hybrid_64_workers_least_waste": lambda: plan_kv_cache(
            searched, split(mamba_hybrid(2), TP, PP), [80 * GiB] * (TP * PP)
        ),
    }
    medians = {name: timed(fn, args.runs) for name, fn in scenarios.items()}
    reference = medians["reference_dense_1_worker"]
    print(
        json.dumps(
            {
                "layers": NUM_LAYERS,
                "workers": TP * PP,
                "runs": args.runs,
                "median_seconds": medians,
                "ratio_to_reference": {k: v / reference for k, v in medians.items()},
                "under_one_second": all(v < 1.0 for v in medians.values()),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
