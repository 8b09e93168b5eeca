"""Block pool build time and memory per block, for a 4-million-block pool.

Prints JSON: median build seconds over runs, bytes per block by tracemalloc (Python
allocations the pool holds) and by resident memory (RSS growth of a fresh child process),
the bytes per block once every block has been used once (freed uncached: the free queue
lists every id) and once every block is cached and free (hash map and LRU entries), and the
same figures for a reference pool in the same process: one Python object per
block linked into a doubly linked free list (the layout vLLM 0.33 uses), built at a
smaller size and reported per block.

    python benchmarks/bench_pool.py [--num-blocks N] [--runs R] [--reference-blocks M]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from pagedkv.runtime import BlockPool


class _RefBlock:
    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: _RefBlock | None = None
        self.next_free: _RefBlock | None = None


def _reference_pool(num_blocks: int) -> list[_RefBlock]:
    blocks = [_RefBlock(i) for i in range(num_blocks)]
    for a, b in itertools.pairwise(blocks):
        a.next_free = b
        b.prev_free = a
    return blocks


def _time_build(build: Any, num_blocks: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        pool = build(num_blocks)
        times.append(time.perf_counter() - start)
        del pool
    return statistics.median(times)


def _held_bytes(build: Any) -> int:
    """Python allocations the object ``build()`` returns still holds (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def _traced_bytes(build: Any, num_blocks: int) -> int:
    return _held_bytes(lambda: build(num_blocks))


class _HashedRequest:
    """The fields ``cache_full_blocks`` reads, for a request of one hash per block."""

    def __init__(self, block_hashes: list[bytes]) -> None:
        self.block_hashes = block_hashes
        self.all_token_ids: list[int] = []
        self.lora_name = None


def _all_cached_bytes(num_blocks: int) -> int:
    """Bytes the pool holds when every block is cached and free (hash objects excluded:
    requests own them)."""
    request = _HashedRequest(
        [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(num_blocks - 1)]
    )

    def build() -> BlockPool:
        pool = BlockPool(num_blocks, hash_block_size=1)
        blocks = pool.get_new_blocks(num_blocks - 1)
        pool.cache_full_blocks(request, blocks, 0, num_blocks - 1, 1, 0)  # type: ignore[arg-type]
        pool.free_blocks(blocks)
        return pool

    return _held_bytes(build)


def _used_once_bytes(num_blocks: int) -> int:
    """Bytes the pool holds once every block has been handed out and freed uncached: the
    free queue then lists every id (vLLM's LIFO part), so the fresh pool's lazy id range
    has become one list entry and one int object per block."""

    def build() -> BlockPool:
        pool = BlockPool(num_blocks, enable_caching=False)
        pool.free_blocks(pool.get_new_blocks(num_blocks - 1))
        return pool

    return _held_bytes(build)


_CHILD = """
import gc, sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
from pagedkv.runtime import BlockPool
gc.collect()
before = rss()
pool = BlockPool({n})
print(rss() - before)
"""


def _rss_bytes(num_blocks: int) -> int | None:
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD.format(n=num_blocks)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-blocks", type=int, default=4_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reference-blocks", type=int, default=400_000)
    args = ap.parse_args(argv)
    n, m = args.num_blocks, args.reference_blocks

    build_s = _time_build(BlockPool, n, args.runs)
    traced = _traced_bytes(BlockPool, n)
    rss = _rss_bytes(n)
    cached = _all_cached_bytes(m)
    used_once = _used_once_bytes(n)
    ref_s = _time_build(_reference_pool, m, max(1, args.runs // 2))
    ref_traced = _traced_bytes(_reference_pool, m)
    result = {
        "num_blocks": n,
        "runs": args.runs,
        "build_seconds_median": round(build_s, 4),
        "bytes_per_block_tracemalloc": round(traced / n, 2),
        "bytes_per_block_rss": None if rss is None else round(rss / n, 2),
        "bytes_per_block_after_every_block_used_once": round(used_once / n, 2),
        "bytes_per_block_all_cached_and_free": round(cached / m, 2),
        "all_cached_measured_at_num_blocks": m,
        "reference": {
            "layout": "one object per block, doubly linked free list",
            "num_blocks": m,
            "build_seconds_median": round(ref_s, 4),
            "build_seconds_per_million_blocks": round(ref_s / m * 1e6, 4),
            "bytes_per_block_tracemalloc": round(ref_traced / m, 2),
        },
        "build_time_per_block_ratio_to_reference": round((build_s / n) / (ref_s / m), 4),
        "bytes_per_block_ratio_to_reference": round((traced / n) / (ref_traced / m), 4),
        "targets": {"build_seconds": 1.0, "bytes_per_block": 64},
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
