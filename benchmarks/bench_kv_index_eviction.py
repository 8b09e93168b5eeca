"""Cost of storing blocks into a bounded KVIndex once it is full (each store evicts).

The index is filled to ``--bound`` entries, then ``--extra`` more blocks are stored in
batches of 1000; reported: microseconds per block stored past the bound. The reference
is the same first-in-first-out eviction over a plain dict (``next(iter(d))`` then
``pop``), which walks the deleted slots at the dict's front on every eviction.

    python benchmarks/bench_kv_index_eviction.py [--bound N] [--extra M]
"""

from __future__ import annotations

import argparse
import json
import time

from pagedkv.cluster import KVIndex
from pagedkv.runtime.events import BlockStored

BATCH = 1000


def stored(hashes: list[int]) -> BlockStored:
    return BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=[], block_size=16,
        lora_id=None, medium="GPU", lora_name=None, group_idx=0,
    )  # fmt: skip


def index_us_per_block(bound: int, extra: int) -> float:
    index = KVIndex(max_blocks=bound)
    for start in range(0, bound, BATCH):
        index.apply("e", [stored(list(range(start, start + BATCH)))])
    t0 = time.perf_counter()
    for start in range(bound, bound + extra, BATCH):
        index.apply("e", [stored(list(range(start, start + BATCH)))])
    return 1e6 * (time.perf_counter() - t0) / extra


def plain_dict_us_per_block(bound: int, extra: int) -> float:
    entries: dict[int, int] = dict.fromkeys(range(bound), 1)
    t0 = time.perf_counter()
    for h in range(bound, bound + extra):
        entries[h] = 1
        if len(entries) > bound:
            entries.pop(next(iter(entries)))
    return 1e6 * (time.perf_counter() - t0) / extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bound", type=int, default=1_000_000)
    parser.add_argument("--extra", type=int, default=100_000)
    args = parser.parse_args()
    result = {
        "bound": args.bound,
        "extra_blocks": args.extra,
        "kv_index_us_per_block": round(index_us_per_block(args.bound, args.extra), 2),
        "plain_dict_fifo_us_per_block": round(plain_dict_us_per_block(args.bound, args.extra), 2),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
