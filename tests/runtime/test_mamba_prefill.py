"""vLLM 0.33's Mamba prefill checkpoints, partial hash hits with copy on write, and
retention intervals (docs/runtime.md has these examples in prose)."""

from __future__ import annotations

import pytest

from pagedkv import EngineConfig, MambaSpec
from pagedkv.errors import ConfigError, KVCacheSpecError
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.specs.mamba import prefill_checkpoint_exportable, prefill_checkpoint_position

from .helpers import check_invariants, full, kv_config, make_manager, mamba, mamba2, swa


def admit(manager: KVCacheManager, req: Request, num_new: int) -> tuple[list[int], ...]:
    hit, num_hit = manager.get_computed_blocks(req)
    out = manager.allocate_slots(req, num_new, num_hit, hit, full_sequence_must_fit=True)
    assert out is not None
    req.num_computed_tokens = num_hit + num_new
    return out.get_block_ids()


def step(manager: KVCacheManager, req: Request, num_new: int) -> tuple[list[int], ...]:
    out = manager.allocate_slots(req, num_new)
    assert out is not None
    req.num_computed_tokens += num_new
    return out.get_block_ids()


# --------------------------------------------------------------- checkpoint position


@pytest.mark.parametrize(
    ("num_tokens", "unit", "drop", "lookahead", "expected"),
    [
        (40, 16, False, 0, 32),  # the last token is recomputed: 39 // 16 * 16
        (48, 16, False, 0, 32),  # a block-aligned prompt backs off a whole block
        (49, 16, False, 0, 48),
        (15, 16, False, 0, 0),
        (48, 16, True, 0, 32),  # EAGLE's drop: 48 // 16 * 16 - 16
        (50, 16, False, 3, 32),  # 3 lookahead tokens must follow the boundary
    ],
)
def test_prefill_checkpoint_position(
    num_tokens: int, unit: int, drop: bool, lookahead: int, expected: int
) -> None:
    assert prefill_checkpoint_position(num_tokens, unit, drop, lookahead) == expected


@pytest.mark.parametrize(
    ("start", "end", "position", "alignment", "ok"),
    [
        (0, 40, 32, 1, True),
        (0, 40, 32, None, False),  # a kernel that cannot export (Mamba-1)
        (0, 40, 32, 64, False),  # 32 tokens from the start is not a 64-token step
        (16, 40, 32, 1, True),
        (24, 40, 32, 1, False),  # the chunk starts off a hash boundary
        (16, 30, 16, 1, False),  # the position must lie strictly inside the chunk
        (32, 40, 32, 1, False),
    ],
)
def test_prefill_checkpoint_exportable(
    start: int, end: int, position: int, alignment: int | None, ok: bool
) -> None:
    assert prefill_checkpoint_exportable(start, end, position, 16, 16, alignment) is ok


def test_spec_fields_are_checked_and_counted() -> None:
    spec = mamba2(16)
    assert spec.max_memory_usage_bytes(EngineConfig()) == 3 * spec.page_size_bytes
    with pytest.raises(KVCacheSpecError, match="num_prefill_checkpoint_blocks"):
        MambaSpec(
            block_size=16, shapes=((4,),), dtypes=("bfloat16",), num_prefill_checkpoint_blocks=-1
        )
    with pytest.raises(KVCacheSpecError, match="prefill_checkpoint_alignment"):
        MambaSpec(
            block_size=16, shapes=((4,),), dtypes=("bfloat16",), prefill_checkpoint_alignment=0
        )


# --------------------------------------------------------------- checkpoints


def test_one_chunk_prefill_keeps_its_checkpoint() -> None:
    """A 40-token prompt in one chunk: the state at 32 (its last reusable boundary) goes to
    a checkpoint block before the running state, and a resend hits it."""
    manager = make_manager([full(16), mamba2(16)], num_blocks=20)
    a = Request("a", list(range(40)))
    new = admit(manager, a, 40)
    _, mamba_ids = manager.get_block_ids("a")
    assert mamba_ids[0] == 0 and mamba_ids[1] and mamba_ids[2]  # null, checkpoint, running
    assert new[1] == mamba_ids
    checkpoint = mamba_ids[1]
    assert manager.block_pool.block_hash[checkpoint] == a.block_hashes[1]
    b = Request("b", [*range(40), 7])
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 32 and hit.blocks[1] == [0, checkpoint]
    check_invariants(manager)


def test_mamba1_needs_a_chunk_ending_on_the_boundary() -> None:
    """Without checkpoint blocks the same chunk keeps only the running state: no hit."""
    manager = make_manager([full(16), mamba(16)], num_blocks=20)
    admit(manager, Request("a", list(range(40))), 40)
    assert manager.get_block_ids("a")[1][:2] == [0, 0]
    _, num_hit = manager.get_computed_blocks(Request("b", [*range(40), 7]))
    assert num_hit == 0


def test_checkpoint_only_on_the_prompts_last_chunk_under_interval_0() -> None:
    """Interval 0 reserves a checkpoint on the chunk reaching the prompt's end only; None
    on every chunk that can export one."""
    for interval, checkpoint in ((0, False), (None, True)):
        manager = make_manager(
            [full(16), mamba2(16)], num_blocks=30, prefix_cache_retention_interval=interval
        )
        a = Request("a", list(range(100)))
        admit(manager, a, 40)  # not the prompt's last chunk
        table = manager.get_block_ids("a")[1]
        assert len(table) == 3 and table[0] == 0 and table[2] != 0
        assert (table[1] != 0) is checkpoint
        check_invariants(manager)


# --------------------------------------------------------------- partial hits


def partial_manager(**kwargs: object) -> KVCacheManager:
    # 64-token blocks hashed every 16 tokens: hits on 16-token boundaries inside a block.
    return make_manager([full(64), mamba(64)], num_blocks=20, hash_block_size=16, **kwargs)


def test_partial_hit_copies_the_shared_block() -> None:
    manager = partial_manager()
    assert manager.enable_partial_hash_hits and manager.cache_hit_alignment_tokens == 16
    prompt = list(range(100))
    a = Request("a", prompt)
    admit(manager, a, 64)
    step(manager, a, 32)  # stops at 96, the prompt's last hash boundary: keyed there
    a_full, a_mamba = manager.get_block_ids("a")
    pool = manager.block_pool
    assert pool.has_key(a_mamba[1], a.block_hashes[5], 1)
    manager.new_step_starts()  # a state keyed this step is not hit until the next
    b = Request("b", prompt)
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 96
    assert hit.blocks == ([a_full[0], a_full[1]], [0, a_mamba[1]])
    new = manager.allocate_slots(b, 4, num_hit, hit)
    assert new is not None
    b_full, b_mamba = manager.get_block_ids("b")
    # b writes its own copies of the blocks the hit ends inside.
    assert b_full[0] == a_full[0] and b_full[1] not in a_full
    assert b_mamba[1] not in a_mamba
    copies = manager.take_kv_cache_block_copies()
    assert [tuple(c) for c in copies.copies] == [(a_full[1], b_full[1]), (a_mamba[1], b_mamba[1])]
    before = pool.num_free_blocks
    pool.free_blocks(copies.retained_blocks)
    assert pool.num_free_blocks == before  # a's blocks and b's copies are still in tables
    check_invariants(manager)


def test_producer_moves_its_partial_key_to_a_copy() -> None:
    """The request that keyed a state inside its block keeps writing that block: its next
    step moves the key to a copy, which stays cached once the copy ran."""
    manager = partial_manager()
    a = Request("a", list(range(100)))
    admit(manager, a, 64)
    step(manager, a, 32)
    source = manager.get_block_ids("a")[1][1]
    step(manager, a, 4)
    (copy,) = [c.dst_block_id for c in manager.release_cow_copies() if c.src_block_id == source]
    pool = manager.block_pool
    assert pool.block_hash[source] is None and pool.has_key(copy, a.block_hashes[5], 1)
    assert pool.ref_cnt[copy] == 0  # cached and free
    check_invariants(manager)


def test_dcp_lets_a_mamba_block_equal_to_the_hash_block_hit_partially() -> None:
    # DCP 4: the attention block spans 4 ranks (8 tokens); Mamba's 2-token block equals
    # the hash block, which alone would not take partial hits.
    specs = [full(8), mamba(2)]
    assert not make_manager(specs, hash_block_size=2).enable_partial_hash_hits
    manager = make_manager(specs, hash_block_size=2, dcp_world_size=4)
    assert manager.enable_partial_hash_hits and manager.cache_hit_alignment_tokens == 2
    with pytest.raises(ConfigError, match="dcp_world_size"):
        make_manager(specs, hash_block_size=2, dcp_world_size=0)


def test_a_failed_copy_on_write_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    manager = partial_manager()
    a = Request("a", list(range(100)))
    admit(manager, a, 64)
    step(manager, a, 32)
    pool = manager.block_pool
    manager.new_step_starts()
    b = Request("b", list(range(100)))
    hit, num_hit = manager.get_computed_blocks(b)
    before = (pool.queue.order(), list(pool.ref_cnt), list(pool.block_hash))
    original = pool.get_new_blocks

    def fail_second(n: int) -> list[int]:
        if fail_second.calls:  # type: ignore[attr-defined]
            raise RuntimeError("injected")
        fail_second.calls += 1  # type: ignore[attr-defined]
        return original(n)

    fail_second.calls = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(pool, "get_new_blocks", fail_second)
    with pytest.raises(RuntimeError, match="injected"):
        manager.allocate_slots(b, 4, num_hit, hit)
    assert (pool.queue.order(), list(pool.ref_cnt), list(pool.block_hash)) == before
    assert not any(m._cow_copies for m in manager.managers)
    check_invariants(manager)


# --------------------------------------------------------------- retention intervals


@pytest.mark.parametrize(
    ("interval", "kept"),
    [
        (0, [11]),  # the replay boundary only: 199 -> 192 tokens, block 11
        (64, [3, 7, 11]),  # the state every 64 tokens
        (None, list(range(12))),  # every block
    ],
)
def test_mamba_retention_interval(interval: int | None, kept: list[int]) -> None:
    manager = make_manager(
        [full(16), mamba(16)], num_blocks=40, prefix_cache_retention_interval=interval
    )
    req = Request("a", list(range(200)))
    m = manager.managers[1]
    assert m.reachable_blocks(req, 0, 12) == (None if interval is None else set(kept))


@pytest.mark.parametrize(
    ("interval", "kept"),
    [
        (0, {8, 9, 10, 11}),  # the window before the replay boundary (192)
        (128, {4, 5, 6, 7, 8, 9, 10, 11}),  # the last window of each 128-token segment
        (None, None),
    ],
)
def test_sliding_window_retention_interval(interval: int | None, kept: set[int] | None) -> None:
    manager = make_manager(
        [full(16), swa(64, 16)], num_blocks=40, prefix_cache_retention_interval=interval
    )
    assert manager.managers[1].reachable_blocks(Request("a", list(range(200))), 0, 12) == kept


@pytest.mark.parametrize(
    ("specs", "interval", "message"),
    [
        ([full(16), mamba(16)], 24, "multiple of the scheduler block size"),
        ([full(16)], 64, "no sliding-window or Mamba"),
    ],
)
def test_retention_interval_is_checked(specs: list, interval: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_manager(specs, prefix_cache_retention_interval=interval)
    make_manager([full(16)], prefix_cache_retention_interval=0)  # 0 (and None) always fit


def test_retention_interval_must_be_non_negative() -> None:
    with pytest.raises(ConfigError, match="prefix_cache_retention_interval"):
        EngineConfig.create(prefix_cache_retention_interval=-16)


@pytest.mark.parametrize(
    ("specs", "unit", "message"),
    [
        ([full(64)], 16, "one KV cache group"),
        ([full(64), mamba(64)], 24, "multiple of it"),
    ],
)
def test_prefix_match_unit_is_checked(specs: list, unit: int, message: str) -> None:
    config = EngineConfig.create(max_model_len=256, prefix_match_unit=unit)
    with pytest.raises(ConfigError, match=message):
        KVCacheManager(kv_config(specs), config)
