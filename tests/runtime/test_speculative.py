"""Speculative decoding in the manager (vLLM 0.33's rules): lookahead slots, lookahead block
hashes, the EAGLE block drop, caching after verification and Mamba's speculative blocks."""

from __future__ import annotations

import pytest

from pagedkv import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec, MambaSpec
from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.runtime import BlockHasher, KVCacheManager, LoRA, Request
from pagedkv.runtime.hashing import sha256_cbor
from pagedkv.specs.mamba import prefill_checkpoint_position

from .helpers import check_invariants, chunked, full, make_manager, swa

SEED = "vllm-none-hash"


def spec_mamba(block_size: int = 4, num_speculative_blocks: int = 2) -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=((4, 4),),
        dtypes=("bfloat16",),
        mamba_cache_mode="align",
        num_speculative_blocks=num_speculative_blocks,
    )


def eagle_manager(
    specs: list[KVCacheSpec], eagle: set[int], num_blocks: int = 32, **kwargs: object
) -> KVCacheManager:
    from pagedkv import EngineConfig

    groups = tuple(
        KVCacheGroupSpec(layer_names=(f"l{i}",), kv_cache_spec=s, is_eagle_group=i in eagle)
        for i, s in enumerate(specs)
    )
    kv = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=groups, max_model_len=256
    )
    config = EngineConfig.create(max_model_len=256, max_num_batched_tokens=64)
    return KVCacheManager(kv, config, hash_algo="sha256_cbor", hash_seed=SEED, **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ lookahead hashes
def test_a_lookahead_hash_waits_for_the_tokens_after_its_block() -> None:
    hasher = BlockHasher(4, "sha256_cbor", seed=SEED, num_lookahead_tokens=1)
    req = Request("r", [1, 2, 3, 4, 5, 6, 7, 8], hasher=hasher)
    assert len(req.block_hashes) == 1  # block 1 needs token 8 (index 8) first
    none = sha256_cbor(SEED)
    first = sha256_cbor((none, (1, 2, 3, 4), (None, 5)))
    assert req.block_hashes == [first]
    req.append_output_token_ids(9)
    assert req.block_hashes == [first, sha256_cbor((first, (5, 6, 7, 8), (None, 9)))]


def test_two_lookahead_tokens_and_extra_keys_follow_vllms_layout() -> None:
    hasher = BlockHasher(4, "sha256_cbor", seed=SEED, num_lookahead_tokens=2)
    lora = LoRA("ad", 1, "/p")
    req = Request("r", list(range(1, 11)), cache_salt="s", lora=lora, hasher=hasher)
    none = sha256_cbor(SEED)
    keys0 = ((("lora", "ad", "/p"), ("cache_salt", "s")), 5, 6)
    first = sha256_cbor((none, (1, 2, 3, 4), keys0))
    second = sha256_cbor((first, (5, 6, 7, 8), ((("lora", "ad", "/p"),), 9, 10)))
    assert req.block_hashes == [first, second]
    # Incremental hashing equals hashing the whole sequence at once.
    grown = Request("g", list(range(1, 9)), cache_salt="s", lora=lora, hasher=hasher)
    grown.append_output_token_ids([9, 10])
    assert grown.block_hashes == req.block_hashes


def test_an_item_in_a_blocks_lookahead_tokens_also_keys_the_next_block() -> None:
    from pagedkv.runtime import MultiModalFeature

    hasher = BlockHasher(4, "sha256_cbor", seed=SEED, num_lookahead_tokens=2)
    items = [MultiModalFeature("A", 3, 2), MultiModalFeature("B", 5, 1)]  # [3, 5) and [5, 6)
    req = Request("r", list(range(10)), mm_features=items, hasher=hasher)
    none = sha256_cbor(SEED)
    first = sha256_cbor((none, (0, 1, 2, 3), ((("mm", "A", 3), ("mm", "B", 5)), 4, 5)))
    second = sha256_cbor((first, (4, 5, 6, 7), ((("mm", "A", -1), ("mm", "B", 1)), 8, 9)))
    assert req.block_hashes == [first, second]


def test_bad_lookahead_settings_are_rejected() -> None:
    with pytest.raises(ConfigError, match="num_lookahead_tokens"):
        BlockHasher(4, num_lookahead_tokens=-1)
    with pytest.raises(ConfigError, match="num_hash_lookahead_tokens"):
        make_manager([full()], num_hash_lookahead_tokens=-2)
    manager = make_manager([full()], num_hash_lookahead_tokens=1)
    req = Request("r", list(range(9)), hasher=BlockHasher(4, manager.hasher.hash_algo))
    with pytest.raises(KVCacheRuntimeError, match="lookahead"):
        manager.get_computed_blocks(req)


# ------------------------------------------------------------------ lookahead slots
def test_lookahead_slots_are_allocated_but_never_cached() -> None:
    manager = make_manager([full()], num_blocks=32, max_model_len=64)
    req = Request("r", list(range(10)))
    new = manager.allocate_slots(req, 10, num_lookahead_tokens=3)
    assert new is not None and len(new.blocks[0]) == 4  # cdiv(10 + 3, 4)
    assert manager.managers[0].num_cached_block["r"] == 2  # only full blocks of the 10 tokens
    req.num_computed_tokens = 10
    req.append_output_token_ids(10)
    # Verifying 1 token + 3 drafts: slots for 14 + 3 lookahead, capped at max_model_len.
    new = manager.allocate_slots(req, 4, num_lookahead_tokens=3)
    assert new is not None and len(manager.get_block_ids("r")[0]) == 5
    # Drafts are not tokens of the request: caching stops at its 11 tokens.
    assert manager.managers[0].num_cached_block["r"] == 2
    near_end = make_manager([full()], num_blocks=32, max_model_len=12)
    out = near_end.allocate_slots(Request("e", list(range(10))), 10, num_lookahead_tokens=8)
    assert out is not None and len(out.blocks[0]) == 3  # 18 slots capped at 12


def test_cache_blocks_after_verification_caches_only_accepted_tokens() -> None:
    manager = make_manager([full()], num_blocks=32)
    req = Request("r", list(range(7)))
    manager.allocate_slots(req, 7, num_lookahead_tokens=3)
    req.num_computed_tokens = 7
    req.append_output_token_ids(7)  # 8 tokens, block 1 full
    manager.allocate_slots(req, 4, num_lookahead_tokens=3)  # token 7 + 3 drafts
    # One draft accepted: 9 computed, two more tokens sampled (vLLM rolls back first).
    req.num_computed_tokens = 9
    req.append_output_token_ids([20, 21])
    manager.cache_blocks(req, req.num_computed_tokens)
    assert manager.managers[0].num_cached_block["r"] == 2
    check_invariants(manager)


def test_multi_module_mtp_leaves_reprefillable_tokens_uncached() -> None:
    manager = make_manager([full()], num_prefill_lookahead=3)
    req = Request("r", list(range(12)))
    manager.allocate_slots(req, 12)
    # The last 2 of 12 tokens may be re-prefilled: 10 tokens, 2 blocks, are final.
    assert manager.managers[0].num_cached_block["r"] == 2


def test_multi_module_mtp_needs_a_scheduler_block_that_covers_it() -> None:
    with pytest.raises(ConfigError, match="num_prefill_lookahead"):
        eagle_manager([full(4)], {0}, use_eagle=True, num_prefill_lookahead=5)


# ------------------------------------------------------------------ EAGLE block drop
def _cache_prompt(manager: KVCacheManager, tokens: list[int]) -> None:
    req = Request("writer", tokens)
    assert manager.allocate_slots(req, len(tokens)) is not None
    manager.free(req)


def test_eagle_drops_the_last_matched_block_of_one_group() -> None:
    tokens = list(range(16))
    plain = eagle_manager([full()], {0})
    eagle = eagle_manager([full()], {0}, use_eagle=True)
    for manager in (plain, eagle):
        _cache_prompt(manager, tokens)
    assert plain.get_computed_blocks(Request("a", tokens))[1] == 12
    # One group: vLLM drops the last block without looking past the bound first.
    blocks, num_hit = eagle.get_computed_blocks(Request("b", tokens))
    assert num_hit == 8 and len(blocks.blocks[0]) == 2


def test_hybrid_eagle_looks_one_block_past_the_bound_then_drops_it() -> None:
    tokens = list(range(16))
    manager = eagle_manager([full(), swa(8)], {0}, use_eagle=True)
    _cache_prompt(manager, tokens)
    # max 15 tokens; the EAGLE full group matches 16 (4 blocks), drops one: 12, which
    # the window group (not an EAGLE group) confirms.
    blocks, num_hit = manager.get_computed_blocks(Request("b", tokens))
    assert num_hit == 12
    assert len(blocks.blocks[0]) == 3 and blocks.blocks[1][:1] == [0]
    assert manager.managers[0].use_eagle and not manager.managers[1].use_eagle


def test_sliding_window_eagle_keeps_and_matches_one_more_block() -> None:
    tokens = list(range(20))
    plain = make_manager([swa(8)], hash_algo="sha256_cbor")
    eagle = eagle_manager([swa(8)], {0}, use_eagle=True)
    cached = []
    for manager in (plain, eagle):
        req = Request("writer", tokens)
        manager.allocate_slots(req, len(tokens))
        table = manager.get_block_ids("writer")[0]
        cached.append([i for i, b in enumerate(table) if manager.block_pool.key_of(b)])
        manager.free(req)
    # Plain: the window (2 blocks) ending at the replay boundary 16. EAGLE: boundaries
    # 12 and 16, each window plus the block past it (the one a lookup matches, then drops).
    assert cached == [[2, 3], [1, 2, 3, 4]]
    # Both hit 16: plain matches blocks 2-3; EAGLE matches 2-4 and drops block 4.
    assert plain.get_computed_blocks(Request("a", [*tokens, 99]))[1] == 16
    assert eagle.get_computed_blocks(Request("b", [*tokens, 99]))[1] == 16


def test_eagle_retention_keeps_the_blocks_a_dropping_lookup_lands_on() -> None:
    manager = eagle_manager([swa(8), full()], {1}, use_eagle=True)
    req = Request("w", list(range(19)))
    manager.allocate_slots(req, 19)
    window = manager.managers[0]
    # Replay boundaries under EAGLE: a resend (hit at most 16) and a longer sibling (16)
    # both land one block lower, at 12: the window group (not an EAGLE group itself)
    # keeps the two blocks before 12. Without EAGLE it would keep those before 16.
    cached = [i for i, b in enumerate(window.req_to_blocks["w"]) if manager.block_pool.key_of(b)]
    assert cached == [1, 2]


def test_chunked_local_attention_cannot_drop_the_eagle_block() -> None:
    with pytest.raises(ConfigError, match="EAGLE block drop"):
        eagle_manager([chunked(8), full()], {0}, use_eagle=True)
    # Lookahead hashes need no drop, so the same layout builds with them.
    eagle_manager([chunked(8), full()], {0}, num_hash_lookahead_tokens=1)


def test_without_marked_groups_every_group_drops() -> None:
    manager = eagle_manager([full(), swa(8)], set(), use_eagle=True)
    assert manager.coordinator.drop_eagle_group_ids == {0, 1}
    hashed = eagle_manager([full(), swa(8)], {0}, num_hash_lookahead_tokens=1)
    assert hashed.coordinator.eagle_group_ids == {0}
    assert not hashed.coordinator.drop_eagle_group_ids


def test_hybrid_eagle_group_caches_one_of_its_blocks_past_the_scheduler_block() -> None:
    # Blocks of 4 and 8 tokens: the scheduler block is 8. 12 tokens round down to 8 for
    # the window group, but the EAGLE group caches up to 8 + 4 = 12 (three blocks).
    manager = eagle_manager([full(4), swa(16, 8)], {0}, use_eagle=True)
    manager.allocate_slots(Request("r", list(range(13))), 12)
    assert manager.managers[0].num_cached_block["r"] == 3
    assert manager.managers[1].num_cached_block["r"] == 1
    plain = eagle_manager([full(4), swa(16, 8)], {0})
    plain.allocate_slots(Request("r", list(range(13))), 12)
    assert plain.managers[0].num_cached_block["r"] == 2


# ------------------------------------------------------------- Mamba speculative blocks
def test_mamba_align_holds_speculative_blocks_and_relocates_them() -> None:
    manager = make_manager([spec_mamba(4, 2)], num_blocks=16)
    mamba = manager.managers[0]
    req = Request("r", list(range(10)))
    assert manager.allocate_slots(req, 10, num_lookahead_tokens=2) is not None
    # cdiv(10, 4) = 3 positions + 2 speculative: the state at 2, scratch at 3 and 4.
    assert manager.get_block_ids("r")[0] == [0, 0, 1, 2, 3]
    req.num_computed_tokens = 10
    req.append_output_token_ids(10)
    # 1 token + 2 drafts: 13 tokens need position 3, which holds scratch block 2: it
    # stays; the table grows by one new block.
    new = manager.allocate_slots(req, 3, num_lookahead_tokens=2)
    assert new is not None and new.blocks[0] == [4]
    assert manager.get_block_ids("r")[0] == [0, 0, 1, 2, 3, 4]
    req.num_computed_tokens = 13
    req.append_output_token_ids([11, 12, 13])
    # All drafts accepted, 16 computed; 1 + 2 drafts more reach 19 tokens (position 4).
    # The state block this step read (1, position 2) is freed first and reused.
    req.num_computed_tokens = 16
    new = manager.allocate_slots(req, 3, num_lookahead_tokens=2)
    assert new is not None and new.blocks[0] == [1]
    assert manager.get_block_ids("r")[0] == [0, 0, 0, 2, 3, 4, 1]
    check_invariants(manager)
    # The first allocation of a new request may take 1 + 2 blocks; later ones one.

    assert mamba.get_num_blocks_to_allocate("o", 40, [], 0, 40, True) == 3
    manager.free(req)
    check_invariants(manager)
    assert manager.num_free_blocks == 15


def test_mamba_relocation_moves_scratch_blocks_behind_the_new_state() -> None:
    manager = make_manager([spec_mamba(4, 2)], num_blocks=16)
    req = Request("r", list(range(4)))
    manager.allocate_slots(req, 4)
    assert manager.get_block_ids("r")[0] == [1, 2, 3]  # state 1, scratch 2 and 3
    req.num_computed_tokens = 4
    req.append_output_token_ids(list(range(4, 13)))
    # Jump to 13 tokens: the new state goes to position 3; scratch blocks 2 and 3
    # (positions 1 and 2) lie below it and move to the end, then one new block follows.
    new = manager.allocate_slots(req, 9)
    assert new is not None and new.blocks[0] == [2, 3, 4]  # moved blocks count as new
    assert manager.get_block_ids("r")[0] == [1, 0, 0, 2, 3, 4]
    check_invariants(manager)


def test_rejected_drafts_can_make_a_mamba_group_need_fewer_blocks() -> None:
    manager = make_manager([spec_mamba(4, 2)], num_blocks=16)
    mamba = manager.managers[0]
    req = Request("r", list(range(11)))
    manager.allocate_slots(req, 11, num_lookahead_tokens=2)
    req.num_computed_tokens = 11
    # Drafts rolled back: 9 tokens need 3 + 2 = 5 entries, the table has 5: nothing new.
    assert mamba.get_num_blocks_to_allocate("r", 9, [], 9, 9) == 0
    mamba.req_to_blocks["r"].append(0)  # a longer table (as after a relocation)
    assert mamba.get_num_blocks_to_allocate("r", 9, [], 9, 9) == -1  # vLLM adds it as is
    mamba.req_to_blocks["r"].pop()


def test_mamba_none_mode_holds_speculative_blocks_too() -> None:
    spec = MambaSpec(
        block_size=64, shapes=((4, 4),), dtypes=("bfloat16",), num_speculative_blocks=2
    )
    manager = make_manager([spec], num_blocks=16, max_model_len=64)
    new = manager.allocate_slots(Request("r", list(range(10))), 10, num_lookahead_tokens=2)
    assert new is not None and len(new.blocks[0]) == 3


def test_prompt_checkpoint_position_follows_vllms_rule() -> None:
    # Leaves the recomputed token (or the lookahead hash tokens) out; under the EAGLE
    # drop one hash block lower.
    assert prefill_checkpoint_position(33, 8, False, 0) == 32
    assert prefill_checkpoint_position(33, 8, False, 2) == 24
    assert prefill_checkpoint_position(32, 8, False, 1) == 24
    assert prefill_checkpoint_position(33, 8, True, 0) == 24
    assert prefill_checkpoint_position(3, 8, True, 0) == 0


def test_a_block_keyed_for_fewer_tokens_takes_its_full_key_when_cached() -> None:
    # A checkpoint exported into table position 1 is keyed by the hash of 4 tokens (one
    # block lower); caching position 1 as a full block re-keys it, as vLLM promotes it.
    from pagedkv.runtime.block_pool import BlockPool
    from pagedkv.runtime.events import BlockRemoved

    pool = BlockPool(8, hash_block_size=4, enable_events=True)
    req = Request("r", list(range(12)), hasher=BlockHasher(4, "sha256_cbor", seed=SEED))
    blocks = pool.get_new_blocks(2)
    pool.cache_partial_block(req, blocks[1], 4, 0, 4)
    assert pool.block_hash[blocks[1]] == req.block_hashes[0]
    pool.take_events()
    pool.cache_full_blocks(req, blocks, 1, 2, 4, 0)
    assert pool.block_hash[blocks[1]] == req.block_hashes[1]
    removed, stored = pool.take_events()
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [req.block_hashes[0]]
    assert stored.block_hashes == [req.block_hashes[1]]  # type: ignore[union-attr]


def test_a_speculative_mamba_block_moves_only_when_exclusive_and_unhashed() -> None:
    from pagedkv.runtime.block_pool import NULL_BLOCK

    manager = make_manager([spec_mamba()])
    mamba, pool = manager.managers[0], manager.block_pool
    block = pool.get_new_blocks(1)[0]
    table = [block]
    mamba._relocate_speculative_block(table, 0)
    assert table == [NULL_BLOCK, block] and pool.ref_cnt[block] == 1
    shared = pool.get_new_blocks(1)[0]
    pool.touch([shared])  # a second holder
    with pytest.raises(KVCacheRuntimeError, match="exclusively owned and unhashed"):
        mamba._relocate_speculative_block([shared], 0)
    with pytest.raises(KVCacheRuntimeError, match="exclusively owned"):
        mamba._relocate_speculative_block([NULL_BLOCK], 0)
