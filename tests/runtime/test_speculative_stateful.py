"""Random speculative-decoding runs (drafts scheduled, verified, partly rejected and rolled
back; lookahead slots; EAGLE drops; Mamba speculative blocks): the pool and every table
stay consistent, block hashes stay those of the tokens, and a failed allocation with
lookahead changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv import EngineConfig, KVCacheConfig, KVCacheGroupSpec, KVCacheSpec, MambaSpec
from pagedkv.runtime import BlockHasher, KVCacheManager, MambaManager, Request

from .helpers import check_invariants, full, swa
from .test_stateful import Injected, exact_state

PREFIXES = ([], [1, 2, 3, 4, 5, 6, 7, 8], [9] * 20, [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14])
MAX_MODEL_LEN = 96
CHUNK_TOKENS = 12
NUM_DRAFTS = 3


def spec_mamba(num_speculative_blocks: int = 2) -> MambaSpec:
    return MambaSpec(
        block_size=4,
        shapes=((4, 4),),
        dtypes=("bfloat16",),
        mamba_cache_mode="align",
        num_speculative_blocks=num_speculative_blocks,
    )


class SpeculativeMachine(RuleBasedStateMachine):
    specs: Callable[[], Sequence[KVCacheSpec]]
    eagle_groups: frozenset[int] = frozenset()
    options: dict[str, Any] = {}
    lookahead_slots = NUM_DRAFTS
    num_blocks = 40

    def __init__(self) -> None:
        super().__init__()
        groups = tuple(
            KVCacheGroupSpec(
                layer_names=(f"l{i}",), kv_cache_spec=s, is_eagle_group=i in self.eagle_groups
            )
            for i, s in enumerate(self.specs())
        )
        kv = KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=(),
            kv_cache_groups=groups,
            max_model_len=MAX_MODEL_LEN,
        )
        config = EngineConfig.create(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=64)
        self.manager = KVCacheManager(kv, config, hash_algo="sha256_cbor", **self.options)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.drafts: dict[str, int] = {}  # drafts each running request holds for its next step
        self.counter = 0

    # ----------------------------------------------------------------- rules
    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 3), max_size=30))
    def add_request(self, prefix: list[int], suffix: list[int]) -> None:
        tokens = (prefix + suffix)[: MAX_MODEL_LEN - 16] or [0]
        self.counter += 1
        self.waiting.append(Request(f"r{self.counter}", tokens))

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def admit(self, index: int) -> None:
        self.manager.new_step_starts()
        req = self.waiting[index % len(self.waiting)]
        hit, num_hit = self.manager.get_computed_blocks(req)
        assert num_hit < req.num_tokens
        num_new = min(req.num_tokens - num_hit, CHUNK_TOKENS)
        out = self.manager.allocate_slots(
            req,
            num_new,
            num_hit,
            hit,
            num_lookahead_tokens=self.lookahead_slots,
            full_sequence_must_fit=True,
        )
        if out is not None:
            req.num_computed_tokens = num_hit + num_new
            self.waiting.remove(req)
            self.running.append(req)
            self.drafts[req.request_id] = 0
            self.verify(req, num_new)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), accepted=st.integers(0, NUM_DRAFTS), token=st.integers(0, 3))
    def step(self, index: int, accepted: int, token: int) -> None:
        """One scheduled step: the rest of the prompt (a chunk) or the last token plus the
        drafts held; then verification accepts some drafts and rolls the rest back."""
        self.manager.new_step_starts()
        req = self.running[index % len(self.running)]
        drafts = self.drafts[req.request_id]
        num_new = min(req.num_tokens + drafts - req.num_computed_tokens, CHUNK_TOKENS)
        if req.num_computed_tokens + num_new > MAX_MODEL_LEN - 1:
            self.finish(req)
            return
        out = self.manager.allocate_slots(req, num_new, num_lookahead_tokens=self.lookahead_slots)
        if out is None:
            self.preempt(req)
            return
        req.num_computed_tokens += num_new
        self.verify(req, num_new, accepted, token)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def finish_or_preempt(self, index: int) -> None:
        req = self.running[index % len(self.running)]
        if index % 2:
            self.finish(req)
        else:
            self.preempt(req)

    @rule(
        index=st.integers(0, 100),
        method=st.sampled_from(["get_new_blocks", "touch", "cache_full_blocks"]),
        call=st.integers(1, 3),
    )
    def failing_allocation(self, index: int, method: str, call: int) -> None:
        """An exception injected in the ``call``-th pool call of an allocation with drafts
        and lookahead slots: everything is exactly as before (Mamba's relocated blocks too)."""
        manager = self.manager
        manager.new_step_starts()
        if self.running:
            req = self.running[index % len(self.running)]
            drafts = self.drafts[req.request_id]
            num_new = min(req.num_tokens + drafts - req.num_computed_tokens, CHUNK_TOKENS)
            if num_new <= 0 or req.num_computed_tokens + num_new > MAX_MODEL_LEN - 1:
                return
            hit, num_hit = None, 0
            manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        elif self.waiting:
            req = self.waiting[index % len(self.waiting)]
            hit, num_hit = manager.get_computed_blocks(req)
            num_new = min(req.num_tokens - num_hit, CHUNK_TOKENS)
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
            manager.allocate_slots(
                req, num_new, num_hit, hit, num_lookahead_tokens=self.lookahead_slots
            )
        except Injected:
            assert exact_state(manager) == before
            return
        finally:
            delattr(pool, method)
        # It went through (fewer pool calls than the injection point): undo by freeing.
        if req in self.waiting:
            manager.free(req)
        else:
            self.preempt(req)

    # --------------------------------------------------------------- helpers
    def verify(self, req: Request, num_new: int, accepted: int = 0, token: int = 0) -> None:
        """The model ran: a request that reached its length samples; drafts beyond the
        accepted ones are rolled back (vLLM's order), then the manager caches."""
        if req.num_computed_tokens < req.num_tokens:
            self.drafts[req.request_id] = 0  # still in prefill: no drafts
            return
        drafts = req.num_computed_tokens - req.num_tokens
        accepted = min(accepted, drafts)
        req.num_computed_tokens -= drafts - accepted
        room = MAX_MODEL_LEN - 1 - req.num_tokens
        sampled = [token] * min(accepted + 1, room)
        req.num_computed_tokens -= accepted + 1 - len(sampled)
        req.append_output_token_ids(sampled)
        self.manager.cache_blocks(req, req.num_computed_tokens)
        self.drafts[req.request_id] = NUM_DRAFTS

    def finish(self, req: Request) -> None:
        self.manager.free(req)
        self.running.remove(req)
        del self.drafts[req.request_id]

    def preempt(self, req: Request) -> None:
        self.manager.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.running.remove(req)
        del self.drafts[req.request_id]
        self.waiting.append(req)

    # ------------------------------------------------------------ invariants
    @invariant()
    def pool_and_tables_agree(self) -> None:
        check_invariants(self.manager)  # refcounts, free + used = total, no double free

    @invariant()
    def tables_cover_the_slots_and_nothing_past_the_tokens_is_cached(self) -> None:
        manager = self.manager
        for req in self.running:
            rid = req.request_id
            for m in manager.managers:
                table = m.req_to_blocks[rid]
                if isinstance(m, MambaManager):
                    # Positions of the computed tokens plus the speculative blocks.
                    assert len(table) >= -(-req.num_computed_tokens // m.block_size)
                    live = [b for b in table if b]
                    assert len(live) <= 2 + m.num_speculative_blocks + 1
                else:
                    assert len(table) * m.block_size >= req.num_computed_tokens
                if m.enable_caching:
                    # Rolled-back drafts are never cached: only the request's own tokens.
                    assert m.num_cached_block[rid] * m.block_size <= max(
                        req.num_tokens, req.num_cached_tokens
                    )

    @invariant()
    def block_hashes_are_the_tokens_hashes(self) -> None:
        hasher = self.manager.hasher
        fresh = BlockHasher(
            hasher.block_size, hasher.hash_algo, num_lookahead_tokens=hasher.num_lookahead_tokens
        )
        for req in self.running:
            again = Request("again", req.all_token_ids, hasher=fresh)
            assert again.block_hashes == req.block_hashes


SETTINGS = settings(max_examples=25, stateful_step_count=30, deadline=None)


def machine(
    name: str,
    specs: Callable[[], Sequence[KVCacheSpec]],
    eagle: frozenset[int] = frozenset(),
    **options: Any,
) -> type:
    attrs = {"specs": staticmethod(specs), "eagle_groups": eagle, "options": options}
    return type(name, (SpeculativeMachine,), attrs)


LookaheadHashMachine = machine(
    "LookaheadHashMachine", lambda: [full()], frozenset({0}), num_hash_lookahead_tokens=1
)
EagleDropHybridMachine = machine(
    "EagleDropHybridMachine", lambda: [swa(8), full()], frozenset({1}), use_eagle=True
)
EagleDropMixedMachine = machine(
    "EagleDropMixedMachine", lambda: [full(4), swa(16, 8)], frozenset({0}), use_eagle=True
)
MambaSpeculativeMachine = machine(
    "MambaSpeculativeMachine",
    lambda: [spec_mamba(2), full()],
    frozenset({1}),
    num_hash_lookahead_tokens=1,
)
MultiModuleMachine = machine(
    "MultiModuleMachine",
    lambda: [full()],
    frozenset({0}),
    num_hash_lookahead_tokens=2,
    num_prefill_lookahead=2,
)

TestLookaheadHash = LookaheadHashMachine.TestCase
TestEagleDropHybrid = EagleDropHybridMachine.TestCase
TestEagleDropMixed = EagleDropMixedMachine.TestCase
TestMambaSpeculative = MambaSpeculativeMachine.TestCase
TestMultiModule = MultiModuleMachine.TestCase
for _case in (
    TestLookaheadHash,
    TestEagleDropHybrid,
    TestEagleDropMixed,
    TestMambaSpeculative,
    TestMultiModule,
):
    _case.settings = SETTINGS
