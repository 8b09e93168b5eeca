"""The skip floor: a window or chunked-local group's skip step is left out until the
request has computed enough tokens for its next block to leave (``next_skip_tokens``).
Leaving it out must change nothing: every table, free count and cached key equals a
manager's that calls the skip step on every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import KVCacheManager, Request
from pagedkv.runtime.managers import SlidingWindowManager

from .helpers import cached_blocks, check_invariants, chunked, full, make_manager, swa


def _managers() -> tuple[KVCacheManager, KVCacheManager]:
    def build() -> KVCacheManager:
        specs = [full(), swa(8), swa(8), chunked(8), swa(12)]
        return make_manager(specs, num_blocks=160, max_model_len=128)

    floored, plain = build(), build()
    steps = [(remove, peers, None, after) for remove, peers, _, after in plain._skip_steps]
    plain._skip_steps = plain.coordinator.skip_steps = steps
    return floored, plain


def _same(a: KVCacheManager, b: KVCacheManager, ids: list[str]) -> None:
    for rid in ids:
        assert a.coordinator.get_block_ids(rid) == b.coordinator.get_block_ids(rid)
    assert a.block_pool.num_free_blocks == b.block_pool.num_free_blocks
    assert cached_blocks(a.block_pool) == cached_blocks(b.block_pool)


ops = st.lists(
    st.tuples(
        st.sampled_from(["step", "step", "step", "reject", "preempt", "public"]),
        st.integers(0, 2),  # request
        st.integers(1, 9),  # tokens
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_floors_change_nothing(script: list[tuple[str, int, int]]) -> None:
    floored, plain = _managers()
    prompts = {f"r{i}": [i * 1000 + t for t in range(40)] for i in range(3)}
    requests: dict[str, tuple[Request, Request]] = {}
    for op, index, num in script:
        rid = f"r{index}"
        if rid not in requests:
            pair = (Request(rid, prompts[rid]), Request(rid, prompts[rid]))
            for manager, req in zip((floored, plain), pair):
                hit, num_hit = manager.get_computed_blocks(req)
                ok = manager.allocate_slots(req, num, num_hit, hit) is not None
                assert ok, "the pool is sized for every request"
                req.num_computed_tokens = num_hit
            requests[rid] = pair
            op = "advance"
        for manager, req in zip((floored, plain), requests[rid]):
            if op == "advance":
                req.num_computed_tokens += num
            elif op == "step":
                room = 128 - req.num_computed_tokens
                if room > 0:
                    assert manager.allocate_slots(req, min(num, room)) is not None
                    req.num_computed_tokens += min(num, room)
            elif op == "reject":  # rejected draft tokens: the count goes back
                req.num_computed_tokens = max(req.num_computed_tokens - num, 1)
            elif op == "public":
                manager.remove_skipped_blocks(rid, req.num_computed_tokens)
            else:
                manager.free(req)
        if op == "preempt":
            del requests[rid]
        _same(floored, plain, list(requests))
        check_invariants(floored)


def test_the_floor_is_the_next_block_leaving_the_window() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=64)
    window = manager.managers[1]
    assert isinstance(window, SlidingWindowManager)
    # Window 8, block 4: 7 tokens are retained; block 0 leaves at 11 computed tokens.
    assert [window.next_skip_tokens(n) for n in (0, 10, 11, 14, 15)] == [11, 11, 15, 15, 19]
    req = Request("a", list(range(20)))
    manager.allocate_slots(req, 12)
    req.num_computed_tokens = 12
    manager.allocate_slots(req, 1)
    assert window.skip_floor == {"a": 15}
    assert manager.get_block_ids("a")[1][0] == 0  # block 0 left
    manager.free(req)
    assert window.skip_floor == {}  # a new request of the same id starts over
