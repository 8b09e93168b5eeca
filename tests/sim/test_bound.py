from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.sim.reports.bound import INSERT, LOOKUP, AccessLog, belady_bound
from pagedkv.sim.traces.keys import chain_keys, full_sequence
from pagedkv.sim.traces.tokens import segment_tokens
from pagedkv.sim.traces.trace import Segment, TraceRequest

BS = 4


def _req(*segments: tuple[int, int], out: int = 0) -> TraceRequest:
    return TraceRequest(0.0, tuple(Segment(*s) for s in segments), out, -1000 - len(segments))


def test_chain_keys_follow_token_equality():
    a = chain_keys((Segment(1, 8), Segment(2, 8)), BS, 4)
    b = chain_keys((Segment(1, 8), Segment(3, 8)), BS, 4)
    c = chain_keys((Segment(1, 6), Segment(2, 10)), BS, 4)
    assert a[:2] == b[:2] and a[2:] != b[2:] and len(a) == 4
    assert c[0] == a[0] and c[1] != a[1]  # block 1 mixes segment 1 and 2 tokens
    assert chain_keys((Segment(1, 7),), BS, 5) == a[:1]  # only full blocks


# The first 10 tokens of these streams are 60 distinct ids, so two segment lists below
# have equal token prefixes exactly when their (segment, offset) runs are equal.
_IDS = (-2, -1, 0, 1, 2, 3)
_SEGMENTS = st.lists(
    st.builds(Segment, st.sampled_from(_IDS), st.integers(0, 10), st.none()), max_size=5
).map(tuple)


def _tokens(segments: tuple[Segment, ...]) -> list[int]:
    return [t for seg in segments for t in segment_tokens(*seg)]


@settings(max_examples=300, deadline=None)
@given(_SEGMENTS, _SEGMENTS)
@pytest.mark.slow
def test_chain_keys_are_equal_exactly_when_the_token_prefixes_are(a, b):
    tokens_a, tokens_b = _tokens(a), _tokens(b)
    keys_a, keys_b = chain_keys(a, BS, 99), chain_keys(b, BS, 99)
    assert len(keys_a) == len(tokens_a) // BS and len(keys_b) == len(tokens_b) // BS
    assert chain_keys(a, BS, 2) == keys_a[:2]
    for i in range(min(len(keys_a), len(keys_b))):
        end = (i + 1) * BS
        assert (keys_a[i] == keys_b[i]) == (tokens_a[:end] == tokens_b[:end])


def test_belady_keeps_the_block_needed_sooner():
    # capacity 1 block: A and B both inserted; A is needed next, then B
    reqs = [_req((1, 5)), _req((2, 5)), _req((1, 5)), _req((2, 5))]
    log = AccessLog()
    log.insert(0, 0, 1)
    log.insert(1, 0, 1)
    log.lookup(2, 1, 5)
    log.lookup(3, 1, 5)
    result = belady_bound(reqs, log, BS, capacity_blocks=1)
    # LRU would keep B (the newer) and hit only request 3; Belady bypasses B, hits 2
    assert result.hit_tokens == BS and result.prompt_tokens == 10
    assert belady_bound(reqs, log, BS, capacity_blocks=2).hit_tokens == 2 * BS
    assert belady_bound(reqs, log, BS, capacity_blocks=0).hit_tokens == 0


def test_a_block_only_counts_after_its_parent():
    reqs = [_req((1, 9)), _req((1, 9))]
    log = AccessLog()
    log.insert(0, 1, 2)  # block 1 without block 0: useless, never admitted
    log.lookup(1, 2, 9)
    assert belady_bound(reqs, log, BS, capacity_blocks=4).hit_tokens == 0
    log2 = AccessLog()
    log2.insert(0, 0, 2)
    log2.lookup(1, 2, 9)
    assert belady_bound(reqs, log2, BS, capacity_blocks=1).hit_tokens == BS
    assert belady_bound(reqs, log2, BS, capacity_blocks=2).hit_tokens == 2 * BS


def test_a_block_cached_before_its_parent_still_counts_once_the_parent_is_cached():
    # Found by the optimality property: the bound refused block 1 because block 0 was not
    # cached yet, although block 0 came in before the lookup (8 tokens, not 4).
    reqs = [
        TraceRequest(0.0, (Segment(0, BS), Segment(0, BS), Segment(0, BS)), 1, -1),
        TraceRequest(0.0, (Segment(0, BS),), 1, -2),
    ]
    log = AccessLog()
    log.events.extend([(INSERT, 0, 1, 2), (INSERT, 0, 0, 1), (LOOKUP, 0, 0, 1), (LOOKUP, 0, 2, 1)])
    assert belady_bound(reqs, log, BS, capacity_blocks=2).hit_tokens == 2 * BS


def _brute_force(reqs, events, capacity):
    """Best hits over every admit/evict choice (no prefix-closure assumed)."""
    need = {}
    for kind, r, a, b in events:
        need[r] = max(need.get(r, 0), a if kind == LOOKUP else b)
    keys = {r: chain_keys(full_sequence(reqs[r]), BS, n) for r, n in need.items()}
    states = {frozenset(): 0}
    for kind, r, a, b in events:
        chain = keys[r]
        if kind == LOOKUP:
            new = {}
            for cache, hits in states.items():
                h = 0
                while h < a and chain[h] in cache:
                    h += 1
                new[cache] = max(new.get(cache, -1), hits + h)
            states = new
            continue
        for key in chain[a:b]:
            new = dict(states)
            for cache, hits in states.items():
                if key in cache:
                    continue
                options = [cache | {key}] if len(cache) < capacity else []
                options += [(cache - {victim}) | {key} for victim in cache]
                for option in options:
                    if len(option) <= capacity:
                        new[option] = max(new.get(option, -1), hits)
            states = new
    return max(states.values()) * BS


@st.composite
def _logs(draw):
    n_reqs = draw(st.integers(2, 5))
    reqs = []
    for i in range(n_reqs):
        segs = draw(
            st.lists(st.tuples(st.integers(0, 2), st.sampled_from([4, 8])), min_size=1, max_size=3)
        )
        reqs.append(TraceRequest(0.0, tuple(Segment(*s) for s in segs), 1, -1 - i))
    events = []
    for _ in range(draw(st.integers(1, 7))):
        r = draw(st.integers(0, n_reqs - 1))
        blocks = (reqs[r].num_prompt_tokens - 1) // BS + 1
        if draw(st.booleans()):
            a = draw(st.integers(0, blocks - 1))
            events.append((INSERT, r, a, draw(st.integers(a + 1, blocks))))
        else:
            events.append((LOOKUP, r, draw(st.integers(0, blocks - 1)), 1))
    return reqs, events, draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(_logs())
@pytest.mark.slow
def test_belady_bound_is_optimal_on_small_logs(case):
    reqs, events, capacity = case
    log = AccessLog()
    log.events.extend(events)
    assert belady_bound(reqs, log, BS, capacity).hit_tokens == _brute_force(reqs, events, capacity)
