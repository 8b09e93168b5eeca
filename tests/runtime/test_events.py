"""KV cache events: which changes emit what, and the three-frame wire layout."""

from __future__ import annotations

import msgspec
import pytest

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.events.wire import decode_event_batch, encode_event_batch
from pagedkv.runtime import AllBlocksCleared, BlockRemoved, BlockStored, Request

from .helpers import full, make_manager, swa


def test_manager_events_follow_store_evict_reset() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=9, enable_events=True)
    req = Request("a", list(range(9)), lora_name="lora-x")
    manager.allocate_slots(req, 9)
    stored = manager.take_events()
    assert [type(e) for e in stored] == [BlockStored, BlockStored]
    first, second = stored
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.group_idx == 0 and first.kv_cache_spec_kind == "full_attention"
    assert second.kv_cache_spec_kind == "sliding_window"
    assert second.kv_cache_spec_sliding_window == 8
    assert first.block_hashes == req.block_hashes[:2] and first.parent_block_hash is None
    assert first.token_ids == list(range(8)) and first.lora_name == "lora-x"
    manager.free(req)
    assert manager.take_events() == []  # freeing keeps blocks cached
    other = Request("b", [5] * 16)
    manager.allocate_slots(other, 16)  # needs every free block: cached ones are evicted
    removed = [e for e in manager.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 4 and {e.group_idx for e in removed} == {0, 1}
    manager.free(other)
    manager.take_events()
    assert manager.reset_prefix_cache()
    assert manager.take_events() == [AllBlocksCleared()]


def test_events_disabled_collects_nothing() -> None:
    manager = make_manager([full()])
    manager.allocate_slots(Request("a", list(range(9))), 9)
    assert manager.take_events() == []


def test_three_frame_layout_round_trips_and_matches_the_published_schema() -> None:
    events = [
        BlockStored(
            block_hashes=[7],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        ),
        BlockRemoved(block_hashes=[7], medium="GPU"),
        AllBlocksCleared(),
    ]
    topic, seq, payload = encode_event_batch(events, 5, ts=1.5, data_parallel_rank=0)
    assert topic == b"" and seq == (5).to_bytes(8, "big")
    # vLLM 0.33: an array batch of maps tagged by class name (tests/events has the rest).
    raw = msgspec.msgpack.decode(payload)
    assert raw[0] == 1.5 and raw[2] == 0
    assert raw[1][0]["type"] == "BlockStored" and raw[1][0]["block_hashes"] == [7]
    assert raw[1][1] == {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}
    assert raw[1][2] == {"type": "AllBlocksCleared"}
    _, number, batch = decode_event_batch([topic, seq, payload])
    assert number == 5 and batch.events == events


def test_malformed_frames_are_rejected() -> None:
    with pytest.raises(KVCacheRuntimeError, match="three frames"):
        decode_event_batch([b"x", b"y"])
    with pytest.raises(KVCacheRuntimeError, match="malformed"):
        decode_event_batch([b"t", bytes(8), b"\xc1"])


def test_events_per_kind_match_the_documented_table() -> None:
    from .helpers import chunked, cross, mamba

    # Sliding window (vLLM retention): only the window a hit at the prompt end (token 23,
    # so a hit of 20 tokens) needs is cached, block 4; a call caching nothing still stores
    # an event with its token range (as vLLM does). Leaving the window emits nothing.
    manager = make_manager([swa(4)], num_blocks=32, enable_events=True)
    req = Request("a", list(range(24)))
    manager.allocate_slots(req, 16)
    req.num_computed_tokens = 16
    (first,) = manager.take_events()
    assert isinstance(first, BlockStored) and first.block_hashes == []
    assert first.token_ids == list(range(16))
    manager.allocate_slots(req, 8)  # blocks 0-2 leave the window; block 4 gets cached
    events = manager.take_events()
    assert [type(e) for e in events] == [BlockStored]
    assert isinstance(events[0], BlockStored) and len(events[0].block_hashes) == 1
    # Mamba (align): the state at the prompt end (a null position here: nothing stored);
    # chunked local: every full block.
    for spec, num_stored in ((mamba(), 0), (chunked(8), 3)):
        m = make_manager([spec], num_blocks=32, enable_events=True)
        m.allocate_slots(Request("b", list(range(13))), 13)
        (stored,) = m.take_events()
        assert isinstance(stored, BlockStored) and len(stored.block_hashes) == num_stored
        assert stored.kv_cache_spec_kind == spec.kind
    # Cross attention: never cached, so never stored.
    m = make_manager([full(), cross()], num_blocks=32, enable_events=True)
    m.allocate_slots(Request("c", list(range(9))), 9, num_encoder_tokens=8)
    assert m.take_events() == []


def test_events_can_leave_token_ids_out() -> None:
    manager = make_manager([full()], num_blocks=16, enable_events=True, event_token_ids=False)
    manager.allocate_slots(Request("a", list(range(9))), 9)
    (stored,) = manager.take_events()
    assert isinstance(stored, BlockStored) and len(stored.block_hashes) == 2
    assert stored.token_ids == []
