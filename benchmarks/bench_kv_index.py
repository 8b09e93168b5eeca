"""KVIndex lookup speed and memory per indexed block.

Lookup: a 32k-token prompt (2048 blocks of 16 tokens) against 100 engines, engine i
holding the prompt's first ``20 * i`` blocks (so the walk cannot stop early), over a
background of other cached blocks. Reported: median microseconds per
``prefix_blocks`` call, the same for a reference in the same process (one hash set per
engine, each walked until its first miss, the way a per-engine radix/set lookup goes),
and the time to hash the prompt's token ids (``PromptHasher``, sha256_cbor).
Memory: tracemalloc bytes per indexed (scope, hash) entry, for hashes held by 1 and by
all engines.

    python benchmarks/bench_kv_index.py [--engines N] [--prompt-tokens T] [--background B]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from pagedkv.cluster import KVIndex, PromptHasher
from pagedkv.runtime.events import BlockStored

BLOCK_SIZE = 16


def _stored(hashes: list[int]) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )


def _median_us(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _bytes_per_entry(num_engines: int, num_hashes: int, holders: int) -> float:
    """Growth of traced memory once the events are gone: the index owns the hash ints."""
    rng = random.Random(1)
    index = KVIndex()
    for e in range(num_engines):
        index.add_engine(f"engine-{e}")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    hashes = [rng.getrandbits(64) for _ in range(num_hashes)]
    for e in range(holders):
        index.apply(f"engine-{e}", [_stored(hashes)])
    del hashes
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / len(index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=100)
    parser.add_argument("--prompt-tokens", type=int, default=32768)
    parser.add_argument("--background", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()

    rng = random.Random(0)
    tokens = [rng.randrange(1 << 16) for _ in range(args.prompt_tokens)]
    hasher = PromptHasher(BLOCK_SIZE, "sha256_cbor")  # the algorithm docs/cluster.md quotes
    hash_us = _median_us(lambda: hasher(tokens), max(args.runs // 10, 3))
    prompt = hasher(tokens)
    index = KVIndex()
    sets: list[set[int]] = []
    per_engine_bg = args.background // args.engines
    for e in range(args.engines):
        held = prompt[: min(20 * e, len(prompt))]
        background = [rng.getrandbits(64) for _ in range(per_engine_bg)]
        index.apply(f"engine-{e}", [_stored(held), _stored(background)])
        sets.append(set(held) | set(background))

    def reference() -> list[int]:
        counts = []
        for held in sets:
            n = 0
            for h in prompt:
                if h not in held:
                    break
                n += 1
            counts.append(n)
        return counts

    assert index.prefix_blocks(prompt) == reference()
    lookup_us = _median_us(lambda: index.prefix_blocks(prompt), args.runs)
    reference_us = _median_us(reference, args.runs)
    print(
        json.dumps(
            {
                "engines": args.engines,
                "prompt_tokens": args.prompt_tokens,
                "prompt_blocks": len(prompt),
                "indexed_entries": len(index),
                "lookup_us_median": round(lookup_us, 1),
                "reference_per_engine_sets_us_median": round(reference_us, 1),
                "speedup_vs_reference": round(reference_us / lookup_us, 1),
                "prompt_hashing_us_median": round(hash_us, 1),
                "bytes_per_entry_1_holder": round(_bytes_per_entry(args.engines, 50_000, 1), 1),
                "bytes_per_entry_all_holders": round(
                    _bytes_per_entry(args.engines, 50_000, args.engines), 1
                ),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
