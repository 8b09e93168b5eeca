"""KV cache events: which changes emit what, and the three-frame wire layout."""

from __future__ import annotations

import msgspec
import pytest

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.events.wire import decode_event_batch, encode_event_batch
from pagedkv.runtime import AllBlocksCleared, BlockRemoved, BlockStored, LoRA, Request

from .helpers import full, make_manager, mamba, swa


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


def _stored_on_the_wire(events: list[object]) -> list[dict[str, object]]:
    """The BlockStored maps of a published batch, read as plain msgpack (no schema)."""
    _, _, payload = encode_event_batch(events, 0)  # type: ignore[arg-type]
    _, batch, _ = msgspec.msgpack.decode(payload)
    return [e for e in batch if e["type"] == "BlockStored"]


def test_stored_events_always_carry_their_token_ids() -> None:
    # vLLM 0.33's BlockStored requires token_ids (block_size per block of the range it
    # caches, a window's skipped null positions included) and has no option to leave
    # them out: a strict consumer checks the length.
    with pytest.raises(TypeError, match="event_token_ids"):
        make_manager([full()], num_blocks=16, enable_events=True, event_token_ids=False)
    managers = [
        make_manager([full(), swa(8)], num_blocks=32, enable_events=True),
        make_manager([full(64), mamba(64)], num_blocks=20, hash_block_size=16, enable_events=True),
    ]
    for manager in managers:
        prompt = list(range(100))
        first = Request("a", prompt)
        manager.allocate_slots(first, 96)
        first.num_computed_tokens = 96
        manager.allocate_slots(first, 4)
        first.num_computed_tokens = 100
        manager.free(first)
        again = Request("b", prompt + [7] * 40, kv_cache_report_mode="full")
        hit, num_hit = manager.get_computed_blocks(again)
        manager.allocate_slots(again, 140 - num_hit, num_hit, hit)
        stored = _stored_on_the_wire(manager.take_events())
        assert stored
        for event in stored:
            hashes, tokens = event["block_hashes"], event["token_ids"]
            assert isinstance(hashes, list) and isinstance(tokens, list) and tokens
            block_size = event["block_size"]
            assert isinstance(block_size, int) and len(tokens) % block_size == 0
            if event["kv_cache_spec_kind"] == "full_attention":
                assert len(tokens) == block_size * len(hashes)
            else:
                assert len(tokens) >= block_size * len(hashes)


def test_stored_events_carry_extra_keys_session_and_lookahead_tokens() -> None:
    # One untagged entry per stored block: the LoRA name on every block, the salt on
    # block 0 (vLLM's published form); lookahead hashes add the tokens each hash covers.
    manager = make_manager([full()], num_blocks=16, enable_events=True, num_hash_lookahead_tokens=1)
    lora = LoRA("ad", 3, "/w")
    req = Request("a", list(range(10)), lora=lora, cache_salt="s", session_id="chat-1")
    manager.allocate_slots(req, 10)
    (stored,) = manager.take_events()
    assert isinstance(stored, BlockStored)
    assert len(stored.block_hashes) == 2  # block 1's hash waits for token 8: it exists
    assert stored.extra_keys == [("ad", "s"), ("ad",)]
    assert stored.lookahead_token_ids == [[4], [8]]
    assert stored.session_id == "chat-1" and stored.lora_id == 3
    plain = make_manager([full()], num_blocks=16, enable_events=True)
    plain.allocate_slots(Request("p", list(range(9))), 9)
    (event,) = plain.take_events()
    assert isinstance(event, BlockStored) and event.extra_keys == [None, None]
    assert event.lookahead_token_ids is None


def test_full_report_mode_reannounces_hits_nulls_included() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=40, enable_events=True)
    writer = Request("w", list(range(20)))
    manager.allocate_slots(writer, 20)
    manager.free(writer)
    manager.take_events()
    quiet = Request("q", [*list(range(20)), 7])
    _, num_hit = manager.get_computed_blocks(quiet)
    assert num_hit == 16 and manager.take_events() == []
    loud = Request("l", [*list(range(20)), 7], kv_cache_report_mode="full")
    _blocks, num_hit = manager.get_computed_blocks(loud)
    events = manager.take_events()
    assert [e.group_idx for e in events if isinstance(e, BlockStored)] == [0, 1]
    full_event, window_event = events
    assert isinstance(full_event, BlockStored) and isinstance(window_event, BlockStored)
    # Every hit position is announced with its hash from block 0, the window group's
    # null positions too; the token ids cover the whole hit.
    assert full_event.block_hashes == loud.block_hashes[:4] == window_event.block_hashes
    assert full_event.parent_block_hash is None and full_event.token_ids == list(range(16))
    assert window_event.kv_cache_spec_kind == "sliding_window"
    with pytest.raises(KVCacheRuntimeError, match="kv_cache_report_mode"):
        Request("x", [1], kv_cache_report_mode="verbose")


def test_take_events_passes_through_a_group_it_does_not_know() -> None:
    manager = make_manager([full()], num_blocks=16, enable_events=True)
    foreign = BlockStored(
        block_hashes=[1],
        parent_block_hash=None,
        token_ids=[],
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=7,
    )
    manager.block_pool._events.append(foreign)  # type: ignore[union-attr]
    (event,) = manager.take_events()
    assert event is foreign and foreign.kv_cache_spec_kind is None


def test_event_spec_kinds_are_vllms() -> None:
    from pagedkv import FullAttentionSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs
    from pagedkv.runtime.events import event_sliding_window, event_spec_kind

    from .helpers import mamba

    mla = MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=8)
    assert event_spec_kind(mla) == "mla_attention"
    assert event_spec_kind(mamba()) == "mamba"
    # A full-attention group merged with a window keeps reporting no window.
    merged = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, sliding_window=8)
    assert event_spec_kind(merged) == "full_attention"
    assert event_sliding_window(merged) is None
    assert event_sliding_window(swa(8)) == 8
    mixed = UniformTypeKVCacheSpecs(
        block_size=4,
        kv_cache_specs={
            "a": full(),
            "b": FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8),
        },
    )
    assert event_spec_kind(mixed) == "full_attention"
    assert (
        event_spec_kind(
            UniformTypeKVCacheSpecs(block_size=4, kv_cache_specs={"a": mla, "b": full()})
        )
        == "full_attention"
    )
