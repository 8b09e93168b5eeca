"""vLLM 0.33's wire layout: map-tagged events in an array batch, 64-bit external hashes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import msgspec
import pytest

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.events.wire import decode_event_batch, encode_event_batch, external_block_hash
from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, BlockStored

from .shared_tool import checker

STORED_ORDER = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
]


def _stored(**extra: object) -> BlockStored:
    return BlockStored(
        block_hashes=[b"\x00" * 24 + b"\x01\x02\x03\x04\x05\x06\x07\x08"],
        parent_block_hash=None,
        token_ids=[1, 2, 3, 4],
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        **extra,  # type: ignore[arg-type]
    )


def test_batch_is_an_array_of_tagged_maps_with_required_fields_always_sent() -> None:
    events = [
        _stored(group_idx=0),
        BlockRemoved(block_hashes=[-1], medium="GPU"),
        AllBlocksCleared(),
    ]
    topic, seq, payload = encode_event_batch(events, 5, ts=1.5)
    assert topic == b"" and seq == (5).to_bytes(8, "big")
    decoded = decode_event_batch(encode_event_batch(events, 5, topic=b"kv", ts=1.5))
    assert decoded.topic == b"kv" and decoded.sequence_number == 5
    assert len(decoded.batch.events) == 3
    raw = msgspec.msgpack.decode(payload)
    assert raw[0] == 1.5 and raw[2] == 0 and len(raw) == 3
    stored, removed, cleared = raw[1]
    assert list(stored) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name", "group_idx",
    ]  # fmt: skip
    assert stored["type"] == "BlockStored" and stored["lora_name"] is None
    assert stored["block_hashes"] == [0x0102030405060708]  # low 64 bits, big-endian
    assert removed == {"type": "BlockRemoved", "block_hashes": [(1 << 64) - 1], "medium": "GPU"}
    assert cleared == {"type": "AllBlocksCleared"}


def test_every_optional_field_goes_out_in_vllm_order() -> None:
    event = _stored(
        extra_keys=[("salt",)],
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=8,
        locality="local",
        ownership="owner",
        session_id="s",
        lookahead_token_ids=[[9]],
    )
    raw = msgspec.msgpack.decode(encode_event_batch([event], 0)[2])
    assert list(raw[1][0]) == STORED_ORDER
    removed = BlockRemoved(block_hashes=[1], medium=None, group_idx=2, locality="l", ownership="o")
    raw = msgspec.msgpack.decode(encode_event_batch([removed], 0)[2])
    assert list(raw[1][0]) == [
        "type",
        "block_hashes",
        "medium",
        "group_idx",
        "locality",
        "ownership",
    ]


def test_external_hash_forms() -> None:
    digest = bytes(range(32))
    assert external_block_hash(digest) == int.from_bytes(digest[-8:], "big")
    assert external_block_hash(digest, int_block_hashes=False) == digest
    assert external_block_hash(-2) == (1 << 64) - 2
    assert external_block_hash(5, int_block_hashes=False) == (5).to_bytes(8, "big")
    with pytest.raises(KVCacheRuntimeError, match="bytes or int"):
        external_block_hash("x")
    raw = msgspec.msgpack.decode(encode_event_batch([_stored()], 0, int_block_hashes=False)[2])
    assert raw[1][0]["block_hashes"] == [b"\x00" * 24 + bytes(range(1, 9))]


def test_the_independent_checker_decodes_pagedkv_payloads() -> None:
    events = [_stored(group_idx=0, kv_cache_spec_kind="full_attention"), AllBlocksCleared()]
    payload = encode_event_batch(events, 0)[2]
    batch = msgspec.msgpack.Decoder(checker.KVEventBatch).decode(payload)
    assert batch.data_parallel_rank == 0
    assert isinstance(batch.events[0], checker.BlockStored)
    assert batch.events[0].block_hashes == [0x0102030405060708]


def test_pagedkv_decodes_a_batch_encoded_in_vllms_layout() -> None:
    # Encoded with the checker's structs (written from vLLM 0.33's), not pagedkv's.
    vllm_batch = checker.KVEventBatch(
        ts=2.0,
        events=[
            checker.BlockStored(
                block_hashes=[11, 12],
                parent_block_hash=10,
                token_ids=list(range(32)),
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                group_idx=0,
                kv_cache_spec_kind="full_attention",
                session_id="conv-1",
            ),
            checker.BlockRemoved(block_hashes=[10], medium="CPU", ownership="shared"),
            checker.AllBlocksCleared(),
        ],
        data_parallel_rank=3,
    )
    frames = [b"kv", (9).to_bytes(8, "big"), msgspec.msgpack.encode(vllm_batch)]
    topic, seq, batch = decode_event_batch(frames)
    assert (topic, seq, batch.ts, batch.data_parallel_rank) == (b"kv", 9, 2.0, 3)
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [11, 12]
    assert stored.parent_block_hash == 10 and stored.session_id == "conv-1"
    assert isinstance(removed, BlockRemoved) and removed.medium == "CPU"
    assert removed.ownership == "shared" and isinstance(cleared, AllBlocksCleared)


def test_old_array_layout_is_rejected_with_a_clear_error() -> None:
    payload = msgspec.msgpack.encode([1.0, [["BlockRemoved", [1], "GPU"]], 0])
    with pytest.raises(KVCacheRuntimeError, match="malformed KV event payload"):
        decode_event_batch([b"", bytes(8), payload])


@pytest.mark.slow
def test_wire_and_facade_import_without_pyzmq() -> None:
    # The simulator and the cluster's hashing use the wire layer: it must not need pyzmq,
    # and the ZeroMQ classes must still fail with ImportError when it is missing.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["zmq"] = None  # any import of it raises ImportError
        import pagedkv
        from pagedkv.events import KVEventsConfig
        from pagedkv.events.wire import encode_event_batch, external_block_hash
        from pagedkv.runtime.events import BlockRemoved
        frames = encode_event_batch([BlockRemoved(block_hashes=[b"x" * 8], medium=None)], 0)
        assert pagedkv.decode_event_batch(frames)[2].events[0].block_hashes == [
            external_block_hash(b"x" * 8)
        ]
        try:
            from pagedkv.events import ZmqEventPublisher
        except ImportError:
            pass
        else:
            raise SystemExit("ZmqEventPublisher imported without pyzmq")
        assert not [m for m in sys.modules if m.startswith("pagedkv.events.p")]
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr + done.stdout


_VLLM_COMPARE = """
import msgspec
from vllm.distributed import kv_events as V
from pagedkv.events.wire import encode_payload
from pagedkv.runtime import events as P
stored = dict(block_hashes=[1, 2**64 - 1], parent_block_hash=5, token_ids=[1, 2, 3],
              block_size=16, lora_id=2, medium="GPU", lora_name="l",
              extra_keys=[("l", "s"), None], group_idx=1, kv_cache_spec_kind="sliding_window",
              kv_cache_spec_sliding_window=64, locality="LOCAL", ownership="x",
              session_id="sess", lookahead_token_ids=[[4], [5]])
bare = dict(block_hashes=[1], parent_block_hash=None, token_ids=[], block_size=16,
            lora_id=None, medium="GPU", lora_name=None)
removed = dict(block_hashes=[3], medium="GPU", group_idx=2, locality="REMOTE", ownership="o")
def events(m):
    return [m.BlockStored(**stored), m.BlockStored(**bare), m.BlockRemoved(**removed),
            m.AllBlocksCleared()]
theirs = msgspec.msgpack.encode(V.KVEventBatch(ts=1.5, events=events(V), data_parallel_rank=0))
ours = encode_payload(events(P), ts=1.5, data_parallel_rank=0)
print(theirs == ours)
"""


@pytest.mark.slow
def test_payload_bytes_equal_vllms_own_structs() -> None:
    """Against vLLM 0.33 itself (its peer venv, where present): the same events encode to
    the same msgpack bytes, every BlockStored and BlockRemoved field set."""
    import os
    from pathlib import Path

    import pagedkv

    venv = Path(os.environ.get("VLLM_PEER_VENV", "/tmp/vllm-peer-venv"))
    python = venv / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"needs vLLM 0.33's peer venv at {venv}")
    src = str(Path(pagedkv.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [str(python), "-c", _VLLM_COMPARE], capture_output=True, text=True, env=env, timeout=300
    )
    if "No module named 'vllm'" in done.stderr:
        pytest.skip("the peer venv has no vLLM")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"
