"""The free queue's cached part against a plain list: order, undo and compaction."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.runtime import cached_log
from pagedkv.runtime.cached_log import CachedLog

NUM_IDS = 40

step = st.tuples(st.sampled_from(["push", "front", "pop", "pop_one", "remove"]), st.integers(1, 6))
transaction = st.tuples(st.lists(step, min_size=1, max_size=6), st.booleans())


@settings(max_examples=150, deadline=None)
@given(st.lists(transaction, max_size=25), st.data())
def test_cached_log_keeps_the_order_of_a_list_and_undoes_exactly(
    transactions: list[tuple[list[tuple[str, int]], bool]], data: st.DataObject
) -> None:
    # Compaction on every push: the renumbering runs between transactions all the time.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cached_log, "_MIN_COMPACTION", 0)
        log = CachedLog(NUM_IDS)
        model: list[int] = []  # head first
        held = list(range(1, NUM_IDS))  # blocks outside the log
        for ops, roll_back in transactions:
            before = list(model)
            undo: list[tuple[str, Any]] = []
            for op, n in ops:
                if op in ("push", "front"):
                    if undo:
                        continue  # frees never happen inside an allocation
                    blocks = held[:n]
                    del held[:n]
                    if op == "push":
                        log.push(blocks)
                        model += blocks
                    else:
                        log.push_front(blocks)
                        model[:0] = blocks
                    before = list(model)  # outside the transaction: not rolled back
                elif op == "pop_one" and model:
                    if undo:
                        continue  # no undo: only outside a transaction
                    block = log.pop_one()
                    assert block == model.pop(0)
                    held.append(block)
                    before = list(model)
                elif op == "pop" and model:
                    out: list[int] = []
                    token = log.pop(out, min(n, len(model)))
                    assert out == model[: len(out)]
                    del model[: len(out)]
                    undo.append(("pop", (out, token)))
                elif op == "remove" and model:
                    block = data.draw(st.sampled_from(model))
                    position = log.remove(block)
                    assert position is not None
                    model.remove(block)
                    undo.append(("remove", (block, position)))
                assert log.order() == model and len(log) == len(model)
            if roll_back:
                for kind, args in reversed(undo):
                    if kind == "pop":
                        log.unpop(*args)
                    else:
                        log.reinsert(*args)
                model = before
            else:
                for kind, args in undo:
                    held += args[0] if kind == "pop" else [args[0]]
            assert log.order() == model and len(log) == len(model)
            assert all((b in log) == (b in model) for b in range(NUM_IDS))


def test_hits_and_frees_without_evictions_keep_the_log_short() -> None:
    # A pool that never evicts: every free adds an entry, every hit leaves one dead.
    log = CachedLog(100)
    log.push(list(range(1, 100)))
    for _ in range(1000):
        for block in (5, 17, 42):
            log.remove(block)
        log.push([5, 17, 42])
    assert len(log) == 99
    assert len(log._log) <= 2 * 99 + cached_log._MIN_COMPACTION + 3
    assert log.order()[-3:] == [5, 17, 42]


def test_remove_many_names_the_blocks_it_does_not_hold() -> None:
    log = CachedLog(10)
    log.push([3, 4])
    log.push_front([7])
    assert log.remove_many([4, 5, 7]) == [1, None, -2]
    assert log.order() == [3] and len(log) == 1


def test_reserve_makes_room_for_larger_ids() -> None:
    log = CachedLog(2)
    log.reserve(50)
    log.push([49, 1])
    assert log.order() == [49, 1]
