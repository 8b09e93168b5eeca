"""KVIndex against a plain model of every engine's blocks, and the prompt hasher."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pagedkv import Request
from pagedkv.cluster import KVIndex, PromptHasher
from pagedkv.errors import ConfigError
from pagedkv.events.wire import EventBatch, external_block_hash
from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.runtime.hashing import LoRA

ENGINES = ["e0", "e1", "e2"]
SCOPES = [("GPU", 0), ("GPU", 1), ("CPU", 0)]


def _stored(hashes: list[int], medium: str | None = "GPU", group: int | None = 0) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=4,
        lora_id=None,
        medium=medium,
        lora_name=None,
        group_idx=group,
    )


class IndexMachine(RuleBasedStateMachine):
    """Random stores (duplicates included), removals, clears, resets on three engines."""

    def __init__(self) -> None:
        super().__init__()
        self.index = KVIndex()
        self.model = {e: {s: Counter[int]() for s in SCOPES} for e in ENGINES}

    @rule(e=st.sampled_from(ENGINES), s=st.sampled_from(SCOPES), hs=st.lists(st.integers(0, 12)))
    def store(self, e: str, s: tuple[str, int], hs: list[int]) -> None:
        self.index.apply(e, [_stored(hs, *s)])
        self.model[e][s].update(hs)

    @rule(e=st.sampled_from(ENGINES), s=st.sampled_from(SCOPES), h=st.integers(0, 12))
    def remove(self, e: str, s: tuple[str, int], h: int) -> None:
        if self.model[e][s][h] > 0:  # engines only remove what they hold
            self.index.apply(e, [BlockRemoved(block_hashes=[h], medium=s[0], group_idx=s[1])])
            self.model[e][s][h] -= 1

    @rule(e=st.sampled_from(ENGINES), reset=st.booleans())
    def clear(self, e: str, reset: bool) -> None:
        if reset:
            self.index.apply_batch(e, EventBatch(ts=0.0, events=[]), reset=True)
        else:
            self.index.apply(e, [AllBlocksCleared()])
        self.model[e] = {s: Counter() for s in SCOPES}

    @invariant()
    def matches_model(self) -> None:
        for e in self.index.engines:
            held = self.index.engine_hashes(e)
            want = {s: {h for h, n in c.items() if n > 0} for s, c in self.model[e].items()}
            assert held == {s: hs for s, hs in want.items() if hs}

    @invariant()
    def prefix_counts_match_brute_force(self) -> None:
        query = [1, 2, 3, 4, 5]
        got = self.index.prefix_blocks(query, group_idx=0, mediums=("GPU",))
        for e, count in zip(self.index.engines, got):
            held = self.model[e][("GPU", 0)]
            want = next((i for i, h in enumerate(query) if held[h] <= 0), len(query))
            assert count == want, (e, count, want)


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_prefix_blocks_per_engine_and_medium() -> None:
    index = KVIndex()
    index.apply("a", [_stored([1, 2, 3])])
    index.apply("b", [_stored([1, 2]), _stored([3], medium="CPU")])
    index.apply("c", [_stored([2, 3])])
    assert index.engines == ["a", "b", "c"]
    assert index.prefix_blocks([1, 2, 3, 4]) == [3, 2, 0]
    assert index.prefix_blocks([1, 2, 3], mediums=("GPU", "CPU")) == [3, 3, 0]
    assert index.prefix_blocks([1, 2, 3], group_idx=1) == [0, 0, 0]
    assert index.holders(2) == ["a", "b", "c"]
    index.remove_engine("b")
    index.apply("d", [_stored([1])])
    assert index.engines == ["a", "d", "c"] and index.prefix_blocks([1, 2]) == [2, 1, 0]


def test_max_blocks_bounds_each_scope_and_forgets_the_oldest() -> None:
    index = KVIndex(max_blocks=3)
    index.apply("a", [_stored([1, 2, 3, 4, 5])])
    assert len(index) == 3 and index.num_index_evictions == 2
    assert index.prefix_blocks([3, 4, 5]) == [3] and index.prefix_blocks([1]) == [0]
    index.apply("a", [BlockRemoved(block_hashes=[1], medium="GPU", group_idx=0)])
    assert index.num_unknown_removals == 1
    with pytest.raises(ConfigError, match="max_blocks"):
        KVIndex(max_blocks=0)


def test_prompt_hasher_matches_the_runtime_with_lora_and_salt() -> None:
    tokens = list(range(50))
    hasher = PromptHasher(16)
    plain = hasher(tokens)
    assert len(plain) == 3
    for kwargs in ({"lora_name": "adapter"}, {"cache_salt": "tenant"}):
        req = Request("r", tokens, hasher=hasher.hasher, **kwargs)  # type: ignore[arg-type]
        keyed = hasher(tokens, **kwargs)  # type: ignore[arg-type]
        assert keyed == [external_block_hash(h) for h in req.block_hashes]
        assert keyed[0] != plain[0]
    with_path = Request("r", tokens, lora=LoRA("adapter", 3, "/p"), hasher=hasher.hasher)
    assert hasher(tokens, lora_name="adapter", lora_path="/p") == [
        external_block_hash(h) for h in with_path.block_hashes
    ]
    assert (
        PromptHasher(16, int_block_hashes=False)(tokens)[0]
        == hasher.hasher(Request("r", tokens))[0]
    )


def test_apply_converts_in_process_hashes_when_asked() -> None:
    digests = [bytes([i]) * 32 for i in range(3)]
    raw = KVIndex()
    raw.apply("a", [_stored(digests)], external_block_hash)  # type: ignore[arg-type]
    raw.apply("a", [BlockRemoved(block_hashes=[digests[2]], medium="GPU", group_idx=0)],
              external_block_hash)  # fmt: skip
    assert raw.engine_hashes("a") == {("GPU", 0): {external_block_hash(d) for d in digests[:2]}}


def test_an_engine_needs_a_name() -> None:
    # "" marks a removed engine's bit: an engine named "" would share its bit with the next
    index = KVIndex()
    with pytest.raises(ConfigError, match="non-empty string"):
        index.add_engine("")
    index.add_engine("a")
    index.remove_engine("a")
    assert index.add_engine("b") == 0  # the freed bit is reused


def test_reset_in_steps_gives_readers_the_lock_between_them() -> None:
    # Clearing one engine of a large index: the feed takes the lock once per step, so a
    # route lookup never waits for the whole scan (which froze them for 1.7 s at 10M).
    index = KVIndex()
    index.apply_batch("a", EventBatch(0.0, [_stored(list(range(5000)))]))
    index.apply_batch("b", EventBatch(0.0, [_stored(list(range(2500)))]))
    steps = sum(1 for _ in index.reset_engine_steps("a", chunk=500))
    assert steps >= 5000 // 500
    assert index.engine_hashes("a") == {}
    assert index.engine_hashes("b") == {("GPU", 0): set(range(2500))}
    assert len(index) == 2500


def test_bounded_index_forgets_exactly_the_oldest() -> None:
    index = KVIndex(max_blocks=100)
    last = 20_000
    for start in range(0, last, 50):
        index.apply_batch("a", EventBatch(0.0, [_stored(list(range(start, start + 50)))]))
    held = index.engine_hashes("a")[("GPU", 0)]
    assert held == set(range(last - 100, last))  # the newest max_blocks, nothing else
    assert index.num_index_evictions == last - 100
