"""Which engines hold which cached blocks, rebuilt from the engines' KV events.

Per scope ``(medium, group_idx)`` one dict maps an external block hash to a bit mask of
the engines holding it: one entry per distinct hash whatever the number of engines
(bench_kv_index.py measures the bytes per entry). An engine storing the same hash twice
(two blocks with equal content, which vLLM allows) is counted in a side table, so the
index follows every BlockRemoved exactly. ``AllBlocksCleared``, a restart or an
unrecoverable loss drops everything the engine held.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence

from pagedkv.errors import ConfigError
from pagedkv.events.wire import EventBatch
from pagedkv.runtime.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
)
from pagedkv.runtime.hashing import BlockHash

__all__ = [
    "Scope",
    "RESET_CHUNK",
    "DEVICE_MEDIUMS",
    "KVIndex",
]

Scope = tuple[str | None, int | None]
RESET_CHUNK = 1 << 16  # entries scanned per step of reset_engine_steps
DEVICE_MEDIUMS: tuple[str | None, ...] = ("GPU", None)


class KVIndex:
    """Block hash -> engines, per (medium, group); prefix-length queries per engine.

    ``max_blocks`` bounds the entries of each scope: past it the oldest-inserted hash is
    forgotten (counted in ``num_index_evictions``), so memory stays bounded whatever the
    engines send; None: unbounded (the engines' own capacity bounds it).
    """

    def __init__(self, max_blocks: int | None = None) -> None:
        if max_blocks is not None and (not isinstance(max_blocks, int) or max_blocks < 1):
            raise ConfigError(f"KVIndex.max_blocks must be a positive integer, got {max_blocks!r}")
        self.max_blocks = max_blocks
        self.engines: list[str] = []  # bit i <-> engines[i] ("" once removed)
        self._bit: dict[str, int] = {}
        self._scopes: dict[Scope, dict[ExternalBlockHash, int]] = {}
        self._dups: dict[tuple[int, Scope], dict[ExternalBlockHash, int]] = {}
        self.num_index_evictions = 0
        self.num_unknown_removals = 0

    # -- engines ---------------------------------------------------------------------
    def add_engine(self, engine: str) -> int:
        """Register ``engine`` (idempotent); its bit number."""
        bit = self._bit.get(engine)
        if bit is None:
            if not isinstance(engine, str) or not engine:
                # "" marks a removed engine's free bit: a live engine cannot have it
                raise ConfigError(f"an engine name must be a non-empty string, got {engine!r}")
            bit = self.engines.index("") if "" in self.engines else len(self.engines)
            if bit == len(self.engines):
                self.engines.append(engine)
            else:
                self.engines[bit] = engine
            self._bit[engine] = bit
        return bit

    def remove_engine(self, engine: str) -> None:
        """Forget ``engine`` and everything it held."""
        self.reset_engine(engine)
        bit = self._bit.pop(engine)
        self.engines[bit] = ""

    def reset_engine(self, engine: str) -> None:
        """Drop every block ``engine`` holds (AllBlocksCleared, restart, lost events)."""
        for _ in self.reset_engine_steps(engine):
            pass

    def reset_engine_steps(self, engine: str, chunk: int = RESET_CHUNK) -> Iterator[None]:
        """``reset_engine`` in steps of at most ``chunk`` entries: a caller that holds a
        lock for readers can release it at each yield, so clearing one engine of a large
        index never stops the others' lookups for long. Between steps the engine may
        still be counted for some blocks (it is being dropped: its answers are void);
        nothing else may change the index until the steps are done."""
        bit = self._bit.get(engine)
        if bit is None:
            return
        mask = 1 << bit
        for scope, entries in list(self._scopes.items()):
            doomed: list[ExternalBlockHash] = []
            items = iter(entries.items())
            while True:
                # values may change while iterating a dict, its size may not: deletions wait
                step = list(itertools.islice(items, chunk))
                if not step:
                    break
                for h, held in step:
                    if held & mask:
                        left = held & ~mask
                        if left:
                            entries[h] = left
                        else:
                            doomed.append(h)
                yield
            for start in range(0, len(doomed), chunk):
                for h in doomed[start : start + chunk]:
                    del entries[h]
                yield
            self._dups.pop((bit, scope), None)

    # -- events ----------------------------------------------------------------------
    def apply(
        self,
        engine: str,
        events: Iterable[KVCacheEvent],
        to_external: Callable[[BlockHash], ExternalBlockHash] | None = None,
    ) -> None:
        """Apply ``engine``'s events, in order. Their hashes are in external form, or
        ``to_external`` converts them (events taken straight from a manager in process)."""
        bit = self.add_engine(engine)
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self.reset_engine(engine)
                continue
            if not isinstance(event, BlockStored | BlockRemoved):
                continue
            hashes = event.block_hashes
            if to_external is not None:
                hashes = [to_external(h) for h in hashes]
            # no group_idx: an engine older than per-group events, which has one group
            group = 0 if event.group_idx is None else event.group_idx
            if isinstance(event, BlockStored):
                self._store(bit, (event.medium, group), hashes)
            else:
                self._remove(bit, (event.medium, group), hashes)

    def apply_batch(self, engine: str, batch: EventBatch, reset: bool = False) -> None:
        """Apply one received batch; ``reset`` (a subscriber's verdict) clears the engine first."""
        if reset:
            self.reset_engine(engine)
        self.apply(engine, batch.events)

    def _store(self, bit: int, scope: Scope, hashes: Sequence[ExternalBlockHash]) -> None:
        entries = self._scopes.get(scope)
        if entries is None:
            # bounded: insertion order kept in a linked list, so the oldest entry is found
            # in constant time (a plain dict walks the deleted slots at its front)
            entries = self._scopes[scope] = {} if self.max_blocks is None else OrderedDict()
        mask = 1 << bit
        for h in hashes:
            held = entries.get(h)
            if held is None:
                entries[h] = mask
                if self.max_blocks is not None and len(entries) > self.max_blocks:
                    self._forget_oldest(scope, entries)
            elif held & mask:
                dups = self._dups.setdefault((bit, scope), {})
                dups[h] = dups.get(h, 0) + 1
            else:
                entries[h] = held | mask

    def _remove(self, bit: int, scope: Scope, hashes: Sequence[ExternalBlockHash]) -> None:
        entries = self._scopes.get(scope, {})
        dups = self._dups.get((bit, scope))
        mask = 1 << bit
        for h in hashes:
            if dups and h in dups:
                dups[h] -= 1
                if not dups[h]:
                    del dups[h]
                continue
            held = entries.get(h, 0)
            if not held & mask:
                self.num_unknown_removals += 1  # forgotten by max_blocks, or a lost store
                continue
            if held == mask:
                del entries[h]
            else:
                entries[h] = held & ~mask

    def _forget_oldest(self, scope: Scope, entries: dict[ExternalBlockHash, int]) -> None:
        assert isinstance(entries, OrderedDict)
        h, mask = entries.popitem(last=False)
        self.num_index_evictions += 1
        for bit in range(mask.bit_length()):
            dups = self._dups.get((bit, scope))
            if mask >> bit & 1 and dups:
                dups.pop(h, None)

    # -- queries ---------------------------------------------------------------------
    def __len__(self) -> int:
        """Distinct (scope, hash) entries."""
        return sum(len(entries) for entries in self._scopes.values())

    def holders(self, block_hash: ExternalBlockHash, scope: Scope = ("GPU", 0)) -> list[str]:
        """Engines that hold ``block_hash`` in ``scope``."""
        mask = self._scopes.get(scope, {}).get(block_hash, 0)
        return [e for bit, e in enumerate(self.engines) if mask >> bit & 1]

    def engine_hashes(self, engine: str) -> dict[Scope, set[ExternalBlockHash]]:
        """Everything the index believes ``engine`` holds, per scope (a scan: for checks)."""
        mask = 1 << self._bit[engine]
        out = {s: {h for h, m in e.items() if m & mask} for s, e in self._scopes.items()}
        return {s: hashes for s, hashes in out.items() if hashes}

    def prefix_blocks(
        self,
        block_hashes: Sequence[ExternalBlockHash],
        *,
        group_idx: int | None = 0,
        mediums: Sequence[str | None] = DEVICE_MEDIUMS,
    ) -> list[int]:
        """Leading blocks of ``block_hashes`` each engine holds (one count per entry of
        ``engines``), looking in ``group_idx`` on any of ``mediums``."""
        tables = [self._scopes[(m, group_idx)] for m in mediums if (m, group_idx) in self._scopes]
        counts = [0] * len(self.engines)
        alive = (1 << len(self.engines)) - 1
        ends: list[tuple[int, int]] = []
        if len(tables) == 1:
            get = tables[0].get
            for i, h in enumerate(block_hashes):
                held = get(h, 0) & alive
                if held != alive:
                    ends.append((alive & ~held, i))
                    alive = held
                    if not alive:
                        break
        elif tables:
            for i, h in enumerate(block_hashes):
                held = 0
                for table in tables:
                    held |= table.get(h, 0)
                held &= alive
                if held != alive:
                    ends.append((alive & ~held, i))
                    alive = held
                    if not alive:
                        break
        else:
            return counts
        if alive:
            ends.append((alive, len(block_hashes)))
        for mask, num_blocks in ends:
            while mask:
                low = mask & -mask
                counts[low.bit_length() - 1] = num_blocks
                mask ^= low
        return counts
