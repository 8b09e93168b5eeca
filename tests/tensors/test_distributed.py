"""plan_across_ranks in 4 real processes over gloo (TP 2 x PP 2, unequal free memory)."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import socket
import time
from datetime import timedelta

import pytest

from pagedkv.config import EngineConfig

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from pagedkv.distributed import (  # noqa: E402
    DistributedPlanningError,
    plan_across_ranks,
)

from . import dist_worker  # noqa: E402

WORLD = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_ranks(world: int, backend: str) -> dict[int, dict]:
    """Start ``world`` spawned ranks and collect their results; never leave one running."""
    ctx = multiprocessing.get_context("spawn")
    results_queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=dist_worker.run_rank, args=(rank, world, port, results_queue, backend))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, dict] = {}
    deadline = time.monotonic() + 90
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, result = results_queue.get(timeout=1)
            except queue_module.Empty:
                continue
            results[rank] = result
    finally:
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
    return results


def run_ranks(world: int, backend: str) -> dict[int, dict]:
    results = spawn_ranks(world, backend)
    if any("Address already in use" in r.get("crash", "") for r in results.values()):
        results = spawn_ranks(world, backend)  # the free port was taken in between: once more
    assert len(results) == world, f"only ranks {sorted(results)} reported back"
    for rank, result in results.items():
        assert "crash" not in result, f"rank {rank} crashed:\n{result['crash']}"
    return results


@pytest.fixture(scope="module")
def rank_results() -> dict[int, dict]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return run_ranks(WORLD, "gloo")


@pytest.mark.slow
def test_every_rank_gets_the_same_block_count_and_its_own_layers(rank_results) -> None:
    specs = dist_worker.rank_specs()
    oks = [rank_results[r]["ok"] for r in range(WORLD)]
    assert all(isinstance(ok, dict) for ok in oks), oks
    assert len({ok["num_blocks"] for ok in oks}) == 1 and oks[0]["num_blocks"] > 1
    assert len({ok["digest"] for ok in oks}) == 1  # same grouping too
    for rank, ok in enumerate(oks):
        assert ok["layers"] == sorted(specs[rank]) == ok["viewed_layers"]
        assert ok["fits"], (rank, ok["device_bytes"], dist_worker.MEMORY[rank])
    # The smallest memory (rank 1) decides: its buffer fills it almost to the block.
    assert oks[1]["device_bytes"] > 0.95 * dist_worker.MEMORY[1]
    # Stage 0 and stage 1 hold disjoint layers; TP peers hold the same ones.
    assert oks[0]["layers"] == oks[1]["layers"] and oks[2]["layers"] == oks[3]["layers"]
    assert not set(oks[0]["layers"]) & set(oks[2]["layers"])


def test_a_rank_reporting_a_different_spec_fails_every_rank(rank_results) -> None:
    for rank in range(WORLD):
        message = rank_results[rank]["mismatch"]
        assert message.startswith("DistributedPlanningError"), message
        assert "different KV cache specs on rank 2" in message and "rank 3" in message
        assert "model.layers.21.self_attn" in message


def test_a_failing_rank_fails_every_rank_and_the_group_survives(rank_results) -> None:
    for rank in range(WORLD):
        message = rank_results[rank]["local_failure"]
        assert message.startswith("DistributedPlanningError"), message
        assert "rank 1: PlanningError" in message and "local_available_memory" in message
        assert rank_results[rank]["after_failures"] == rank_results[0]["ok"]["num_blocks"]


def test_a_dead_rank_makes_the_others_raise_instead_of_hanging(rank_results) -> None:
    for rank in range(WORLD - 1):
        message = rank_results[rank]["dead_rank"]
        assert message.startswith("DistributedPlanningError"), message
        assert "rank" in message


def test_needs_an_initialized_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(DistributedPlanningError, match="not initialized"):
        plan_across_ranks(EngineConfig.create(), {}, 0, timeout=timedelta(seconds=1))


@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
    reason="needs 2 CUDA devices and NCCL",
)
def test_nccl_ranks_agree_and_share_failures() -> None:
    results = run_ranks(2, "nccl")
    oks = [results[r]["ok"] for r in range(2)]
    assert all(isinstance(ok, dict) for ok in oks), oks
    assert oks[0]["num_blocks"] == oks[1]["num_blocks"] and oks[0]["digest"] == oks[1]["digest"]
    assert all(ok["fits"] for ok in oks)
    for rank in range(2):
        assert results[rank]["mismatch"].startswith("DistributedPlanningError")
        assert "rank 1: PlanningError" in results[rank]["local_failure"]
        assert results[rank]["after_failures"] == oks[0]["num_blocks"]
