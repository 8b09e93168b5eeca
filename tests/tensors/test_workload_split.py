"""MiniScheduler's Mamba align-mode chunk split is vLLM 0.33's: the same rules as
``pagedkv.sim.scheduling.chunking.aligned_chunk`` (which the tensors layer may not import)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.config import EngineConfig
from pagedkv.planning.planner import get_kv_cache_configs
from pagedkv.runtime import KVCacheManager
from pagedkv.sim.scheduling.chunking import aligned_chunk
from pagedkv.specs import FullAttentionSpec, MambaSpec

pytest.importorskip("torch")

from pagedkv.tensors.workload import MiniScheduler, WorkloadRequest


@given(
    start=st.integers(0, 300),
    asked=st.integers(1, 300),
    num_prompt=st.integers(1, 300),
    num_outputs=st.integers(0, 40),
    junction=st.integers(0, 400),
    block=st.integers(1, 96),
    budget=st.integers(1, 128),
    hit=st.booleans(),
)
def test_split_agrees_with_the_simulators(
    start: int,
    asked: int,
    num_prompt: int,
    num_outputs: int,
    junction: int,
    block: int,
    budget: int,
    hit: bool,
) -> None:
    req = SimpleNamespace(
        num_computed_tokens=0 if hit else start,
        num_prompt_tokens=num_prompt,
        num_tokens=num_prompt + num_outputs,
        shared_prefix_boundary=junction,
    )
    num_hit = start if hit else 0
    scheduler = SimpleNamespace(_state_block_size=block, max_num_batched_tokens=budget)
    got = MiniScheduler._split(scheduler, req, num_hit, asked)  # type: ignore[arg-type]
    assert got == aligned_chunk(req, asked, num_hit, block, budget)


def test_a_request_with_no_boundary_in_reach_waits_for_the_next_step() -> None:
    """Budget 60, blocks of 16: the first prompt takes 48 tokens (a boundary); the 12
    left hold no boundary for the second prompt, which vLLM does not admit this step."""
    specs = {
        "a": FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float32"),
        "s": MambaSpec(
            block_size=16, shapes=((4, 6),), dtypes=("float32",), mamba_cache_mode="align"
        ),
    }
    config = EngineConfig.create(
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=60,
        num_gpu_blocks_override=64,
        mamba_cache_mode="align",
    )
    (kv_cache_config,) = get_kv_cache_configs(config, [specs], [1 << 30])
    manager = KVCacheManager(kv_cache_config, config)
    workload = [
        WorkloadRequest("a", tuple(range(100)), (1,)),
        WorkloadRequest("b", (7,) * 40, (1,)),
    ]
    scheduler = MiniScheduler(manager, workload, max_num_batched_tokens=60, arrivals_per_step=2)
    assert manager.scheduler_block_size == 16
    chunks = scheduler.step()
    assert [(c.request.request_id, c.num_new_tokens) for c in chunks] == [("a", 48)]
    assert [r.request_id for r in scheduler.waiting] == ["b"]
    scheduler.finish_step(chunks)
    ran = [[("a", 48)]]
    for _ in range(2):
        chunks = scheduler.step()
        ran.append([(c.request.request_id, c.num_new_tokens) for c in chunks])
        scheduler.finish_step(chunks)
    # a stops at its last checkpoint (96) and the 12 tokens left still hold no boundary
    # for b; then a finishes its prompt and b runs to its own last checkpoint (32)
    assert ran == [[("a", 48)], [("a", 48)], [("a", 4), ("b", 32)]]
