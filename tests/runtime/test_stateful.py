"""Random request sequences through every kind and a hybrid model; invariants after every step."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import KVCacheSpec
from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime import FullAttentionManager, KVCacheManager, Request, UnitaryCoordinator
from pagedkv.runtime.events import BlockRemoved

from .helpers import (
    cached_blocks,
    check_invariants,
    chunked,
    cross,
    full,
    make_manager,
    mamba,
    mamba2,
    swa,
)

PREFIXES = ([], [1, 2, 3, 4, 5, 6, 7, 8], [9] * 20, [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14])
CHUNK_TOKENS = 12
MAX_MODEL_LEN = 96


class Injected(RuntimeError):
    pass


# Set by the capacity check before an allocation's transaction (as vLLM's), and set again
# by every allocation before it is read: not part of what a rollback restores.
SCRATCH = frozenset({"_checkpoints"})


def exact_state(manager: KVCacheManager) -> dict[str, object]:
    """Everything a rolled-back allocation must restore, order included."""
    pool = manager.block_pool
    groups = [
        {
            k: copy.deepcopy(v)
            for k, v in vars(m).items()
            if isinstance(v, dict | set | list) and k not in SCRATCH
        }
        for m in manager.managers
    ]
    return {
        "free_queue": pool.queue.order(),
        "cached": cached_blocks(pool),
        "hashes": list(pool.block_hash),
        "extra_keys": copy.deepcopy(pool._extra_keys),
        "key_tokens": dict(pool._key_tokens),
        "ref": list(pool.ref_cnt),
        "evictions": pool.num_evictions,
        "events": len(pool._events or ()),
        "groups": groups,
    }


class KVCacheMachine(RuleBasedStateMachine):
    specs: Callable[[], Sequence[KVCacheSpec]]
    num_blocks = 40
    encoder_tokens = 0  # > 0 for encoder-decoder layouts (cross attention)
    enable_events = False  # True: evictions are checked against BlockRemoved events
    retention = "vllm"
    options: dict[str, object] = {}  # more KVCacheManager keywords
    # Every BlockRemoved is an eviction, unless keys inside blocks (partial hits) give way
    # to full ones or transient checkpoints lose theirs.
    removals_are_evictions = True
    failing_methods = ("get_new_blocks", "touch", "cache_full_blocks")

    def __init__(self) -> None:
        super().__init__()
        self.manager: KVCacheManager = make_manager(
            self.specs(),
            num_blocks=self.num_blocks,
            max_model_len=MAX_MODEL_LEN,
            enable_events=self.enable_events,
            retention=self.retention,
            **self.options,
        )
        self.num_removed = 0
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.prompts: list[list[int]] = []
        self.counter = 0

    @initialize()
    def start(self) -> None:
        self.manager.new_step_starts()

    # ----------------------------------------------------------------- rules
    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 3), max_size=30))
    def add_request(self, prefix: list[int], suffix: list[int]) -> None:
        tokens = (prefix + suffix)[: MAX_MODEL_LEN - 8] or [0]
        self.counter += 1
        self.waiting.append(Request(f"r{self.counter}", tokens))
        self.prompts.append(tokens)

    @precondition(lambda self: self.prompts)
    @rule(index=st.integers(0, 100), extra=st.lists(st.integers(0, 3), max_size=6))
    def resend(self, index: int, extra: list[int]) -> None:
        """An earlier prompt again, maybe extended (hits at its cached boundaries)."""
        tokens = (self.prompts[index % len(self.prompts)] + extra)[: MAX_MODEL_LEN - 8]
        self.counter += 1
        self.waiting.append(Request(f"r{self.counter}", tokens))

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def admit(self, index: int) -> None:
        self.manager.new_step_starts()
        req = self.waiting[index % len(self.waiting)]
        hit, num_hit = self.manager.get_computed_blocks(req)
        self.check_hit(req, hit.blocks, num_hit)
        num_new = min(req.num_tokens - num_hit, CHUNK_TOKENS)
        if (
            self.manager.allocate_slots(
                req, num_new, num_hit, hit, num_encoder_tokens=self.encoder_tokens
            )
            is not None
        ):
            req.num_computed_tokens = num_hit + num_new
            self.waiting.remove(req)
            self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), token=st.integers(0, 3))
    def step(self, index: int, token: int) -> None:
        self.manager.new_step_starts()
        req = self.running[index % len(self.running)]
        if req.num_computed_tokens < req.num_tokens:
            num_new = min(req.num_tokens - req.num_computed_tokens, CHUNK_TOKENS)
        elif req.num_tokens < MAX_MODEL_LEN:
            req.append_output_token_ids(token)
            num_new = 1
        else:
            self.finish_request(req)
            return
        if self.manager.allocate_slots(req, num_new) is None:
            self.preempt(req)
        else:
            req.num_computed_tokens += num_new

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def finish_or_abort(self, index: int) -> None:
        self.finish_request(self.running[index % len(self.running)])

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def preempt_one(self, index: int) -> None:
        self.preempt(self.running[index % len(self.running)])

    @rule(prefix=st.sampled_from(PREFIXES), extra=st.integers(1, 40), running=st.booleans())
    def cross_max_model_len(self, prefix: list[int], extra: int, running: bool) -> None:
        """Asking for slots past max_model_len (a too-long prompt, or a running request
        pushed past it) is a typed error that changes nothing."""
        self.manager.new_step_starts()
        if running and self.running:
            req = self.running[extra % len(self.running)]
            num_new = MAX_MODEL_LEN - req.num_computed_tokens + extra
            hit, num_hit = None, 0
        else:
            self.counter += 1
            req = Request(
                f"r{self.counter}",
                (prefix + [5] * (MAX_MODEL_LEN + extra))[: MAX_MODEL_LEN + extra],
            )
            hit, num_hit = self.manager.get_computed_blocks(req)
            num_new = req.num_tokens - num_hit
        pool = self.manager.block_pool
        before = (
            pool.queue.order(),
            cached_blocks(pool),
            self.manager.get_block_ids(req.request_id),
        )
        with pytest.raises(KVCacheRuntimeError, match="max_model_len"):
            self.manager.allocate_slots(
                req, num_new, num_hit, hit, num_encoder_tokens=self.encoder_tokens
            )
        after = (
            pool.queue.order(),
            cached_blocks(pool),
            self.manager.get_block_ids(req.request_id),
        )
        assert after == before

    @rule(ids=st.lists(st.integers(0, 39), max_size=6))
    def evict_blocks(self, ids: list[int]) -> None:
        """Drop hashes of random blocks (free or in use); they stay where they are."""
        pool = self.manager.block_pool
        ids = [i % pool.num_blocks for i in ids]
        queue = pool.queue.order()
        self.manager.evict_blocks(ids)
        assert pool.queue.order() == queue
        assert all(pool.key_of(i) is None for i in ids)

    @rule(data=st.data())
    def release_copies(self, data: st.DataObject) -> None:
        """The engine ran the queued copies: their blocks' extra references go back."""
        pending = [pair for m in self.manager.managers for pair in m._cow_copies]
        copies = self.manager.release_cow_copies()
        assert [tuple(c) for c in copies] == pending
        assert not any(m._cow_copies for m in self.manager.managers)

    @rule(
        index=st.integers(0, 100),
        method_index=st.integers(0, 10),
        call=st.integers(1, 3),
        admit=st.booleans(),
    )
    def failing_allocation(self, index: int, method_index: int, call: int, admit: bool) -> None:
        """An exception injected after the ``call``-th call of a pool method: the pool
        (free blocks in order, hash map, references) and every manager's state are
        exactly as before the allocation (window releases happen before it, as in vLLM)."""
        method = self.failing_methods[method_index % len(self.failing_methods)]
        manager = self.manager
        manager.new_step_starts()
        if admit and self.waiting:
            req = self.waiting[index % len(self.waiting)]
            hit, num_hit = manager.get_computed_blocks(req)
            num_new = min(req.num_tokens - num_hit, CHUNK_TOKENS)
        elif self.running:
            req = self.running[index % len(self.running)]
            if req.num_computed_tokens >= req.num_tokens:
                return
            hit, num_hit = None, 0
            num_new = min(req.num_tokens - req.num_computed_tokens, CHUNK_TOKENS)
            manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        else:
            return
        before = exact_state(manager)
        pool = manager.block_pool
        original = getattr(pool, method)
        calls = [0]

        def failing(*args: object, **kwargs: object) -> object:
            calls[0] += 1
            result = original(*args, **kwargs)
            if calls[0] == call:
                raise Injected(method)
            return result

        setattr(pool, method, failing)
        try:
            out = manager.allocate_slots(
                req, num_new, num_hit, hit, num_encoder_tokens=self.encoder_tokens
            )
        except Injected:
            out = None
            assert exact_state(manager) == before
            return
        finally:
            delattr(pool, method)
        if req in self.waiting and out is not None:
            req.num_computed_tokens = num_hit + num_new
            self.waiting.remove(req)
            self.running.append(req)
        elif req in self.running:
            if out is None:
                self.preempt(req)
            else:
                req.num_computed_tokens += num_new

    @rule()
    def reset_prefix_cache(self) -> None:
        # Queued copies hold their blocks too (until release_cow_copies).
        busy = bool(self.running) or any(m._cow_copies for m in self.manager.managers)
        assert self.manager.reset_prefix_cache() is (not busy)
        if not busy:
            assert cached_blocks(self.manager.block_pool) == {}

    # --------------------------------------------------------------- helpers
    def finish_request(self, req: Request) -> None:
        self.manager.free(req)
        self.running.remove(req)

    def preempt(self, req: Request) -> None:
        self.manager.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.running.remove(req)
        self.waiting.append(req)

    def check_hit(self, req: Request, blocks: tuple[list[int], ...], num_hit: int) -> None:
        pool = self.manager.block_pool
        assert num_hit < req.num_tokens
        if isinstance(self.manager.coordinator, UnitaryCoordinator) and isinstance(
            self.manager.managers[0], FullAttentionManager
        ):
            # Full attention: the hit is the longest run of cached leading blocks.
            bs = self.manager.managers[0].block_size
            cached = pool.hash_map(0)
            expected = 0
            while expected < (req.num_tokens - 1) // bs and req.block_hashes[expected] in cached:
                expected += 1
            assert num_hit == expected * bs
        unit = self.manager.hash_block_size
        for gid, (m, ids) in enumerate(zip(self.manager.managers, blocks)):
            if num_hit:
                assert num_hit % self.manager.cache_hit_alignment_tokens == 0
                assert len(ids) == -(-num_hit // m.block_size)
            scale = m.block_size // unit
            for i, block in enumerate(ids):
                if block:
                    # A block's own key, or the hit's (a hit ending inside the block).
                    h = req.block_hashes[min((i + 1) * scale, num_hit // unit) - 1]
                    assert pool.has_key(block, h, gid)

    @invariant()
    def identical_groups_have_nulls_at_the_same_positions(self) -> None:
        # The running path checks only the first of identical window groups for blocks
        # to remove; that relies on this.
        by_key: dict[tuple[type, object], list[dict[str, list[int]]]] = {}
        for m in self.manager.managers:
            by_key.setdefault((type(m), m.kv_cache_spec), []).append(m.req_to_blocks)
        for tables in by_key.values():
            for rid, table in tables[0].items():
                nulls = [b == 0 for b in table]
                assert all([b == 0 for b in other[rid]] == nulls for other in tables[1:])

    @invariant()
    def evictions_match_removed_events(self) -> None:
        if self.enable_events and self.removals_are_evictions:
            for event in self.manager.take_events():
                if isinstance(event, BlockRemoved):
                    self.num_removed += len(event.block_hashes)
            assert self.manager.num_evictions == self.num_removed

    @invariant()
    def consistent(self) -> None:
        check_invariants(
            self.manager,
            {r.request_id: r.num_computed_tokens for r in self.running},
            self.encoder_tokens,
        )


SETTINGS = settings(max_examples=25, stateful_step_count=30, deadline=None)


def machine(
    name: str,
    specs: Callable[[], Sequence[KVCacheSpec]],
    encoder_tokens: int = 0,
    enable_events: bool = False,
    retention: str = "vllm",
    **options: object,
) -> type:
    attrs = {
        "specs": staticmethod(specs),
        "encoder_tokens": encoder_tokens,
        "enable_events": enable_events,
        "retention": retention,
        "options": options,
    }
    if options.get("hash_block_size"):
        attrs["removals_are_evictions"] = False
    if options.get("hash_block_size") or any(s.kind == "mamba" for s in specs()):
        attrs["failing_methods"] = (
            *KVCacheMachine.failing_methods,
            "cache_partial_block",
            "move_block_keys",
            "uncache_block",
        )
    return type(name, (KVCacheMachine,), attrs)


FullMachine = machine("FullMachine", lambda: [full()])
SlidingWindowMachine = machine("SlidingWindowMachine", lambda: [swa(8)])
ChunkedLocalMachine = machine("ChunkedLocalMachine", lambda: [chunked(8)])
MambaAlignMachine = machine("MambaAlignMachine", lambda: [mamba()])
MambaNoneMachine = machine(
    "MambaNoneMachine", lambda: [mamba(block_size=MAX_MODEL_LEN, mode="none")]
)
HybridMachine = machine("HybridMachine", lambda: [full(), swa(8), mamba()])
MixedBlockHybridMachine = machine("MixedBlockHybridMachine", lambda: [full(4), swa(16, 8)])
SharedWindowMachine = machine("SharedWindowMachine", lambda: [swa(8), full(), swa(8)])
EncoderDecoderMachine = machine("EncoderDecoderMachine", lambda: [full(), cross()], 10)
EventsHybridMachine = machine(
    "EventsHybridMachine", lambda: [full(), swa(8), swa(8)], enable_events=True
)
DenseHybridMachine = machine(
    "DenseHybridMachine", lambda: [full(), swa(8), mamba()], retention="dense"
)
# vLLM 0.33's Mamba prefill checkpoints (Mamba-2 / gated DeltaNet), on the prompt's last
# chunk (interval 0) or on every chunk (interval None).
MambaCheckpointMachine = machine("MambaCheckpointMachine", lambda: [full(), mamba2()])
MambaCheckpointDenseMachine = machine(
    "MambaCheckpointDenseMachine",
    lambda: [mamba2(8, 8), full(8)],
    prefix_cache_retention_interval=None,
)
# Partial hits: hashed every 4 tokens, 16-token blocks (hits inside a block, copy on write).
PartialHitMachine = machine(
    "PartialHitMachine", lambda: [full(16), mamba(16), mamba(16)], hash_block_size=4
)
PartialHitEventsMachine = machine(
    "PartialHitEventsMachine",
    lambda: [full(16), mamba2(16, 4)],
    enable_events=True,
    hash_block_size=4,
)
# vLLM's retention intervals: a checkpoint every 16 tokens, or every block (None).
RetentionIntervalMachine = machine(
    "RetentionIntervalMachine",
    lambda: [full(), swa(8), mamba()],
    prefix_cache_retention_interval=16,
)
RetentionNoneMachine = machine(
    "RetentionNoneMachine", lambda: [swa(8), mamba()], prefix_cache_retention_interval=None
)

TestFull = FullMachine.TestCase
TestSlidingWindow = SlidingWindowMachine.TestCase
TestChunkedLocal = ChunkedLocalMachine.TestCase
TestMambaAlign = MambaAlignMachine.TestCase
TestMambaNone = MambaNoneMachine.TestCase
TestHybrid = HybridMachine.TestCase
TestMixedBlockHybrid = MixedBlockHybridMachine.TestCase
TestEncoderDecoder = EncoderDecoderMachine.TestCase
TestSharedWindow = SharedWindowMachine.TestCase
TestEventsHybrid = EventsHybridMachine.TestCase
TestDenseHybrid = DenseHybridMachine.TestCase
TestMambaCheckpoint = MambaCheckpointMachine.TestCase
TestMambaCheckpointDense = MambaCheckpointDenseMachine.TestCase
TestPartialHit = PartialHitMachine.TestCase
TestPartialHitEvents = PartialHitEventsMachine.TestCase
TestRetentionInterval = RetentionIntervalMachine.TestCase
TestRetentionNone = RetentionNoneMachine.TestCase
for _case in (
    TestFull,
    TestSlidingWindow,
    TestChunkedLocal,
    TestMambaAlign,
    TestMambaNone,
    TestHybrid,
    TestMixedBlockHybrid,
    TestEncoderDecoder,
    TestSharedWindow,
    TestEventsHybrid,
    TestDenseHybrid,
    TestMambaCheckpoint,
    TestMambaCheckpointDense,
    TestPartialHit,
    TestPartialHitEvents,
    TestRetentionInterval,
    TestRetentionNone,
):
    _case.settings = SETTINGS
