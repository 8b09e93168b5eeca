"""Small traces whose counts were worked out by hand (block size 4)."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.errors import ConfigError
from pagedkv.sim.scheduling.scheduler import SchedulerSettings

from .helpers import make_setup, make_trace


def _run(setup, trace, **settings):
    # the hand-worked cases below have every request waiting at t=0
    settings.setdefault("arrivals", "all")
    return setup.simulator(SchedulerSettings(**settings)).run(trace)


def test_second_request_hits_the_first_ones_full_blocks():
    # R0: 8 prompt tokens (2 blocks), 2 outputs; R1 = the same 8 tokens + 4 more, 1 output.
    # One request at a time: R0 prefill (step 1), decode (step 2, done), R1 prefill (step 3).
    # R1 may hit at most 11 tokens -> the 2 cached blocks = 8 tokens.
    trace = make_trace((((1, 8),), 2), (((1, 8), (2, 4)), 1))
    res = _run(make_setup(64), trace, max_num_seqs=1)
    assert (res.prompt_tokens, res.hit_tokens, res.hit_requests, res.admitted_requests) == (
        20,
        8,
        1,
        2,
    )
    assert res.hit_rate == pytest.approx(0.4) and res.request_hit_rate == 0.5
    assert (res.steps, res.preemptions, res.requests_done) == (3, 0, 2)
    assert res.manager_calls_by_kind == {
        "get_computed_blocks": 2,
        "allocate_slots": 3,
        "free": 2,
        "new_step_starts": 3,
    }
    assert res.manager_calls == 10 and res.allocate_slots_failed == 0
    # R1's 12 prompt tokens need 3 blocks while it runs (2 shared + 1 new)
    assert res.peak_used_blocks == 3


def test_last_token_is_always_recomputed():
    # the same 8-token prompt twice: at most 7 tokens may hit -> only 1 block (4 tokens)
    trace = make_trace((((1, 8),), 1), (((1, 8),), 1))
    res = _run(make_setup(64), trace, max_num_seqs=1)
    assert res.hit_tokens == 4


def test_preemption_by_recomputation_and_readmission():
    # 4 usable blocks; two 8-token prompts (2 blocks each), 5 outputs each, K=2.
    # step 1: both admitted (pool full), each samples token 1.
    # step 2: R0 needs a 3rd block -> fails -> R1 (newest) preempted and freed (its tail
    #   block is evicted first and handed to R0); no admissions in a preempting step.
    # steps 3-5: R0 decodes (done in step 5); R1's re-admission fails each time: it hits
    #   its first block but needs 3 blocks with only 1 free.
    # step 6: R1 re-admitted: 9 tokens, hit 4 (block 0), decodes in steps 7-9.
    trace = make_trace((((1, 8),), 5), (((2, 8),), 5))
    res = _run(make_setup(5), trace, max_num_seqs=2)
    assert res.preemptions == 1
    assert (res.prompt_tokens, res.hit_tokens) == (16, 0)
    assert (res.readmission_tokens, res.readmission_hit_tokens) == (9, 4)
    assert res.steps == 9 and res.requests_done == 2 and res.peak_running == 2
    assert res.allocate_slots_failed == 4
    assert res.manager_calls_by_kind == {
        "get_computed_blocks": 6,
        "allocate_slots": 14,
        "free": 3,
        "new_step_starts": 9,
    }
    assert res.peak_used_blocks == 4 and res.peak_usage == 1.0
    # step 2 evicts R1's tail block; step 6 R1 needs 2 new blocks: R0's two last cached blocks
    assert res.evictions == 3  # the manager's own counter, no KV cache events needed


def test_evictions_come_from_the_manager_counter_without_events():
    sim = make_setup(5).simulator(SchedulerSettings(arrivals="all", max_num_seqs=2))
    trace = make_trace((((1, 8),), 5), (((2, 8),), 5))
    assert sim.run(trace).evictions == sim.mgr.num_evictions == 3
    assert sim.mgr.take_events() == []  # events off: no event handling in manager time


def test_request_that_never_fits_is_dropped_and_counted():
    # 12 tokens need 3 blocks; only 2 usable -> unservable, the next one still runs
    trace = make_trace((((1, 12),), 1), (((2, 4),), 1))
    res = _run(make_setup(3), trace)
    assert res.requests_unservable == 1 and res.requests_done == 1
    assert res.prompt_tokens == 4


def test_too_long_requests_are_rejected():
    trace = make_trace((((1, 64),), 1), (((2, 4),), 1))
    res = _run(make_setup(64, max_model_len=64), trace)
    assert res.requests_rejected_too_long == 1 and res.requests_done == 1


def test_chunked_prefill_and_token_budget():
    # 20-token prompt, chunks of 8 within a 8-token budget: 8 + 8 + 4 -> 3 prefill steps,
    # then 2 decode steps for 3 outputs
    trace = make_trace((((1, 20),), 3))
    res = _run(make_setup(64), trace, max_prefill_chunk=8, max_num_batched_tokens=8)
    assert res.steps == 5
    assert res.manager_calls_by_kind["allocate_slots"] == 5
    settings = SchedulerSettings(arrivals="all", max_prefill_chunk=8, max_num_batched_tokens=8)
    assert res.settings == dataclasses.asdict(settings)  # the run records what it ran with


def test_hybrid_sliding_window_frees_out_of_window_blocks_and_hits():
    # full + sliding window (window 4: 3 tokens kept). R0: 32 tokens in chunks of 8.
    # Full group: 2, 4, 6, 8 blocks after each chunk. Window group: out-of-window blocks
    # freed before each chunk: 2, then 1 + 2, 1 + 2, 1 + 2 -> 8 + 3 = 11 blocks.
    # R1 repeats R0's prompt plus 4 tokens. vLLM's retention cached only the window block
    # a hit at R0's prompt end (token 31 -> 28) needs, so R1 hits 28 tokens, not 32, and
    # holds 9 full + 3 window blocks (6, 7, 8) = 12 at its peak.
    trace = make_trace((((1, 32),), 1), (((1, 32), (2, 4)), 1))
    hybrid = make_setup(64, window=4)
    res = _run(hybrid, trace, max_num_seqs=1, max_prefill_chunk=8)
    assert res.peak_used_blocks == 12
    assert res.hit_tokens == 28 and res.prompt_tokens == 68
    assert res.kv_cache_groups == ("FullAttentionSpecx1", "SlidingWindowSpecx1")
    full_only = _run(make_setup(64), trace, max_num_seqs=1, max_prefill_chunk=8)
    # without a window group the peak is R1's 36 tokens = 9 blocks (R0's 32 took 8)
    assert full_only.peak_used_blocks == 9
    assert full_only.hit_tokens == 32


def test_dense_retention_keeps_every_window_block():
    # the trace above with pagedkv's opt-in dense retention: R0's window blocks all stay
    # cached, so R1 hits 32 tokens and needs 9 full + 2 window blocks (8, and the cached
    # 7 it hit) = 11 at its peak; the choice survives re-planning for another block count
    trace = make_trace((((1, 32),), 1), (((1, 32), (2, 4)), 1))
    dense = dataclasses.replace(make_setup(64, window=4), retention="dense")
    res = _run(dense, trace, max_num_seqs=1, max_prefill_chunk=8)
    assert (res.hit_tokens, res.peak_used_blocks, res.retention) == (32, 11, "dense")
    assert dense.with_num_blocks(32).simulator().mgr.retention == "dense"
    assert _run(make_setup(64, window=4), trace).retention == "vllm"


def test_timestamp_arrivals_wait_for_the_clock():
    trace = make_trace((((1, 4),), 1), (((2, 4),), 1))
    trace = trace._replace(
        requests=tuple(r._replace(arrival_s=10.0 * i) for i, r in enumerate(trace.requests))
    )
    res = _run(make_setup(64), trace, arrivals="timestamp")
    assert res.steps == 2 and res.requests_done == 2
    assert res.peak_running == 1


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="max_num_seqs"):
        SchedulerSettings(max_num_seqs=0)
    with pytest.raises(ConfigError, match="arrivals"):
        SchedulerSettings(arrivals="sometimes")  # type: ignore[arg-type]


def test_mamba_align_mode_cuts_prefill_chunks_at_block_boundaries(tmp_path):
    # full + Mamba (align, 4-token blocks); 10-token prompt, 3 tokens per step.
    # chunks: 3 (0 -> 3: no boundary inside), 1 (3 -> 4: stop at the boundary),
    # 3 (4 -> 7), 1 (7 -> 8), 2 (8 -> 10, the prompt end) -> 5 steps instead of 4
    from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
    from pagedkv.specs import FullAttentionSpec, MambaSpec

    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8)
    mamba = MambaSpec(
        block_size=4, shapes=((4, 4),), dtypes=("bfloat16",), mamba_cache_mode="align"
    )
    groups = (
        KVCacheGroupSpec(layer_names=("attn",), kv_cache_spec=full),
        KVCacheGroupSpec(layer_names=("ssm",), kv_cache_spec=mamba),
    )
    cfg = KVCacheConfig(
        num_blocks=64, kv_cache_tensors=(), kv_cache_groups=groups, max_model_len=64
    )
    plain = make_setup(64, max_model_len=64)
    hybrid = dataclasses.replace(plain, kv_cache_config=cfg)
    trace = make_trace((((1, 10),), 1))
    tight = {"max_prefill_chunk": 3, "max_num_batched_tokens": 3}
    assert _run(plain, trace, **tight).steps == 4
    res = _run(hybrid, trace, **tight)
    assert res.steps == 5 and res.requests_done == 1
    # 17 tokens in chunks of 9: plain 9 + 8; aligned 8 (cut to a boundary), 8 (stops at
    # 16, the last boundary before the final token), 1
    longer = make_trace((((1, 17),), 1))
    for setup, expected in ((plain, ["9", "8"]), (hybrid, ["8", "8", "1"])):
        path = tmp_path / "steps.csv"
        setup.simulator(SchedulerSettings(max_prefill_chunk=9)).run(longer, steps_path=str(path))
        rows = [line.split(",") for line in path.read_text().splitlines()[1:]]
        assert [row[4] for row in rows] == expected


class _AdmissionRecorder:
    """The real manager, recording ``has_scheduled_reqs`` of every admission."""

    def __init__(self, manager):
        self._manager = manager
        self.seen = []

    def __getattr__(self, name):
        return getattr(self._manager, name)

    def _record(self, request, has_scheduled_reqs):
        return has_scheduled_reqs

    def allocate_slots(
        self,
        request,
        num_new_tokens,
        num_new_computed_tokens=0,
        new_computed_blocks=None,
        *,
        full_sequence_must_fit=False,
        has_scheduled_reqs=True,
    ):
        if full_sequence_must_fit:
            self.seen.append(self._record(request, has_scheduled_reqs))
        return self._manager.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            full_sequence_must_fit=full_sequence_must_fit,
            has_scheduled_reqs=has_scheduled_reqs,
        )


def test_admission_tells_the_manager_whether_anything_runs():
    # as vLLM's scheduler: has_scheduled_reqs = bool(running) (the watermark applies only
    # then). K=2. Step 1 admits R0 (nothing runs) and R1 (R0 runs); R0 finishes in step 1.
    # Step 2 admits R2 while R1 decodes.
    trace = make_trace((((1, 4),), 1), (((2, 4),), 2), (((3, 4),), 1))
    sim = make_setup(64).simulator(SchedulerSettings(arrivals="all", max_num_seqs=2))
    recorder = _AdmissionRecorder(sim.mgr)
    sim.mgr = recorder
    res = sim.run(trace)
    assert recorder.seen == [False, True, True]
    assert res.requests_done == 3 and res.steps == 2


class _BoundaryReturning(_AdmissionRecorder):
    """A vLLM-style manager: the lookup returns the shared-prefix boundary as a third
    value and leaves storing it on the request to the scheduler."""

    def get_computed_blocks(self, request):
        blocks, num_hit = self._manager.get_computed_blocks(request)[:2]
        request.shared_prefix_boundary = 0
        return blocks, num_hit, 8

    def _record(self, request, has_scheduled_reqs):
        return request.shared_prefix_boundary


def test_a_boundary_returned_by_the_lookup_is_kept_on_the_request():
    # Mamba align mode reads the junction from the request (vLLM's Scheduler stores it)
    sim = make_setup(64).simulator(SchedulerSettings())
    recorder = _BoundaryReturning(sim.mgr)
    sim.mgr = recorder
    res = sim.run(make_trace((((1, 12),), 1)))
    assert recorder.seen == [8] and res.requests_done == 1


class _IgnoresFullSequence(_AdmissionRecorder):
    """The real manager, told to reserve only the first chunk at admission."""

    def allocate_slots(self, request, *args, full_sequence_must_fit=False, **kwargs):
        return super().allocate_slots(request, *args, full_sequence_must_fit=False, **kwargs)


def test_admission_waits_until_the_whole_prompt_fits():
    # 5 usable blocks of 4 tokens. R0: 4 prompt tokens, 8 outputs (3 blocks at its end).
    # R1: 20 prompt tokens (5 blocks) in 4-token chunks. As vLLM's scheduler
    # (scheduler_reserve_full_isl), R1 is not admitted beside R0: its whole prompt does not
    # fit into the 4 free blocks, though its first chunk would; it starts once R0 is done,
    # and nothing is preempted. Admitting on the first chunk alone over-commits the cache.
    trace = make_trace((((1, 4),), 8), (((2, 20),), 1))
    settings = SchedulerSettings(arrivals="all", max_prefill_chunk=4)
    sim = make_setup(6).simulator(settings)
    res = sim.run(trace)
    assert (res.requests_done, res.preemptions, res.steps) == (2, 0, 8 + 5)
    eager = make_setup(6).simulator(settings)
    eager.mgr = _IgnoresFullSequence(eager.mgr)
    assert eager.run(trace).preemptions > 0


def _finish_order(setup, trace, settings):
    loop = setup.simulator(settings).loop(trace)
    order: list[int] = []
    while loop.has_work:
        order += loop.step().finished
    return order, loop


def test_priority_policy_serves_the_lowest_priority_value_first():
    # three requests at t=0, one running at a time: priorities 2, 0, 1 -> R1, R2, R0
    reqs = make_trace((((1, 8),), 2), (((2, 8),), 2), (((3, 8),), 2)).requests
    trace = make_trace()._replace(
        requests=tuple(r._replace(arrival_s=0.0, priority=p) for r, p in zip(reqs, (2, 0, 1)))
    )
    fcfs = SchedulerSettings(arrivals="all", max_num_seqs=1)
    assert _finish_order(make_setup(64), trace, fcfs)[0] == [0, 1, 2]
    priority = dataclasses.replace(fcfs, policy="priority")
    assert _finish_order(make_setup(64), trace, priority)[0] == [1, 2, 0]


def test_priority_policy_preempts_the_largest_priority_value():
    # 4 usable blocks. R0 (priority 0) and R1 (priority 5) each take 2 blocks at t=0; R0's
    # decode needs a 3rd block: FCFS preempts the newest (R1), priority R1 as well; with
    # the priorities swapped, FCFS still preempts R1 but priority preempts R0 itself.
    reqs = make_trace((((1, 8),), 5), (((2, 8),), 5)).requests
    for priorities, victim in (((0, 5), 1), ((5, 0), 0)):
        trace = make_trace()._replace(
            requests=tuple(r._replace(arrival_s=0.0, priority=p) for r, p in zip(reqs, priorities))
        )
        settings = SchedulerSettings(arrivals="all", max_num_seqs=2, policy="priority")
        seen: list[int] = []
        loop = make_setup(5).simulator(settings).loop(trace)
        loop.scheduler.on_preempt = lambda seq, seen=seen: seen.append(seq.index)
        while loop.has_work:
            loop.step()
        assert seen[0] == victim


def test_long_prefill_threshold_applies_only_while_another_request_is_eligible():
    # vLLM: a long prefill alone may use the whole budget; beside another it is capped
    alone = make_trace((((1, 20),), 1))
    settings = SchedulerSettings(arrivals="all", long_prefill_token_threshold=8)
    assert _run(make_setup(64), alone, arrivals="all", long_prefill_token_threshold=8).steps == 1
    both = make_trace((((1, 20),), 1), (((2, 20),), 1))
    loop = make_setup(64).simulator(settings).loop(both)
    assert loop.step().num_scheduled_tokens == 16  # 8 + 8
    adaptive = dataclasses.replace(settings, long_prefill_token_threshold_adaptive=True,
                                   max_num_batched_tokens=40)  # fmt: skip
    loop = make_setup(64).simulator(adaptive).loop(both)
    assert loop.step().num_scheduled_tokens == 40  # floor: 40 // 2 requests = 20 each


def test_no_per_request_prefill_cap_by_default():
    # vLLM has no per-request chunk limit: a 5000-token prompt takes the 8192 budget
    trace = make_trace((((1, 5000),), 1))
    res = _run(make_setup(2048, max_model_len=8192), trace, arrivals="all")
    assert res.steps == 1 and res.settings["max_prefill_chunk"] is None
