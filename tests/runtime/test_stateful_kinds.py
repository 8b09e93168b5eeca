"""Random request sequences through the ring-buffer, R-SWA and HiSparse kinds (alone and
next to full attention): no block leaks, reference counts match the tables, free plus
used blocks make the pool, and every table has the shape its kind promises."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

from pagedkv import (
    CircularBufferSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheSpec,
    RSWASpec,
)
from pagedkv.runtime import Request
from pagedkv.runtime.managers import (
    CircularBufferManager,
    HiSparseHotManager,
    RSWAManager,
)
from pagedkv.specs.base import cdiv

from .helpers import check_invariants, full
from .test_stateful import KVCacheMachine

RING_ROWS = 2
RSWA_WINDOW = 8
HOT_BLOCKS = 3


def ring() -> CircularBufferSpec:
    return CircularBufferSpec(block_size=RING_ROWS, num_kv_heads=1, head_size=8, head_size_v=0)


def rswa(block_size: int = 4) -> RSWASpec:
    return RSWASpec(block_size=block_size, num_kv_heads=1, head_size=8, rswa_window=RSWA_WINDOW)


def hot() -> HiSparseHotSpec:
    return HiSparseHotSpec(block_size=4, page_size=64, blocks_per_request=HOT_BLOCKS)


def resident() -> HiSparseResidentSpec:
    return HiSparseResidentSpec(block_size=4, page_size=64)


class KindsMachine(KVCacheMachine):
    specs: Callable[[], Sequence[KVCacheSpec]]

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), steps=st.integers(1, 16))
    def decode(self, index: int, steps: int) -> None:
        """Several decode steps of one request, so windows slide and gaps open."""
        for _ in range(steps):
            running = [r for r in self.running if r.num_computed_tokens == r.num_tokens]
            if not running:
                return
            self.step(index, 1)

    def check_hit(self, req: Request, blocks: tuple[list[int], ...], num_hit: int) -> None:
        assert num_hit < req.num_tokens
        for m, ids in zip(self.manager.managers, blocks):
            if m.enable_caching and num_hit:
                assert len(ids) == num_hit // m.block_size
            elif not m.enable_caching:
                assert ids == []  # a kind outside the cache never hits

    @invariant()
    def consistent(self) -> None:
        # Pool against tables: reference counts, free + used = total, no block twice.
        check_invariants(self.manager)
        for m in self.manager.managers:
            assert set(m.req_to_blocks) == {r.request_id for r in self.running}
        for req in self.running:
            for m in self.manager.managers:
                self.check_table(m, req, m.req_to_blocks[req.request_id])

    def check_table(self, m: object, req: Request, table: list[int]) -> None:
        tokens = req.num_computed_tokens
        if isinstance(m, CircularBufferManager):
            assert len(table) == 1 and table[0] != 0
        elif isinstance(m, HiSparseHotManager):
            assert len(table) in (0, HOT_BLOCKS) and 0 not in table
        else:
            assert len(table) == cdiv(tokens, m.block_size)  # type: ignore[attr-defined]
        if isinstance(m, RSWAManager):
            # Nulls only in the gap: after the prompt, before the decode window.
            first = cdiv(req.num_prompt_tokens, m.block_size)
            for i, block in enumerate(table):
                if block == 0:
                    assert i >= first and (i + 1) * m.block_size <= tokens - RSWA_WINDOW


def kinds_machine(name: str, specs: Callable[[], Sequence[KVCacheSpec]]) -> type:
    return type(name, (KindsMachine,), {"specs": staticmethod(specs)})


RingMachine = kinds_machine("RingMachine", lambda: [full(), ring()])
RSWAMachine = kinds_machine("RSWAMachine", lambda: [rswa()])
RSWARingMachine = kinds_machine("RSWARingMachine", lambda: [rswa(), ring(), full()])
HiSparseMachine = kinds_machine("HiSparseMachine", lambda: [full(), hot(), resident()])

TestRing = RingMachine.TestCase
TestRSWA = RSWAMachine.TestCase
TestRSWARing = RSWARingMachine.TestCase
TestHiSparse = HiSparseMachine.TestCase
for _case in (TestRing, TestRSWA, TestRSWARing, TestHiSparse):
    _case.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
