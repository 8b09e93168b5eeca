"""One rank of the 4-process gloo planning test (TP 2 x PP 2), run in a spawned process.

Runs the scenarios in order on one process group and puts ``(rank, results)`` on the
queue; every failure it expects is recorded as ``"ErrorType: message"``.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from datetime import timedelta
from typing import Any

GiB = 1 << 30
TP, PP = 2, 2
MEMORY = [3 * GiB, 5 * GiB // 2, 4 * GiB, 7 * GiB // 2]  # unequal free memory per rank
TIMEOUT_S = 5.0


def rank_specs(tp: int = TP, pp: int = PP) -> list[dict[str, Any]]:
    from pagedkv.models import get_kv_cache_specs, load_model_config

    model = load_model_config("gemma-2-9b-it")
    return get_kv_cache_specs(model, tensor_parallel_size=tp, pipeline_parallel_size=pp)


def _attempt(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _summary(config: Any, memory_bytes: int) -> dict[str, Any]:
    from pagedkv.distributed import plan_digest
    from pagedkv.tensors import allocate_kv_cache

    views = allocate_kv_cache(config, "meta")  # real views, no real memory
    return {
        "num_blocks": config.num_blocks,
        "layers": sorted(config.layer_names),
        "viewed_layers": sorted(views.layers),
        "device_bytes": config.device_bytes,
        "fits": config.device_bytes <= memory_bytes,
        "digest": plan_digest(config),
        "num_groups": len(config.kv_cache_groups),
    }


def run_rank(rank: int, world: int, port: int, queue: Any, backend: str = "gloo") -> None:
    """gloo: TP 2 x PP 2 over 4 ranks, every scenario. nccl: TP 2 over 2 GPUs, every
    scenario but the dead rank (NCCL has no monitored barrier)."""
    results: dict[str, Any] = {}
    try:
        import torch
        import torch.distributed as dist

        from pagedkv.config import EngineConfig
        from pagedkv.distributed import plan_across_ranks

        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=TIMEOUT_S),
        )
        tp, pp = (TP, PP) if world == TP * PP else (world, 1)
        config = EngineConfig.create(
            block_size=16, max_model_len=4096, tensor_parallel_size=tp, pipeline_parallel_size=pp
        )
        specs = rank_specs(tp, pp)[rank]
        memory = MEMORY[rank]

        def plan(local_specs: Any = specs, local_memory: Any = memory) -> Any:
            return plan_across_ranks(config, local_specs, local_memory, timeout=TIMEOUT_S)

        results["ok"] = _attempt(lambda: _summary(plan(), memory))
        # The last rank disagrees with its TP peer on one layer's spec.
        changed = dict(specs)
        if rank == world - 1:
            name = sorted(changed)[0]
            changed[name] = dataclasses.replace(changed[name], num_kv_heads=8)
        results["mismatch"] = _attempt(lambda: plan(changed))
        results["local_failure"] = _attempt(lambda: plan(local_memory=-1 if rank == 1 else memory))
        results["after_failures"] = _attempt(lambda: plan().num_blocks)
        if backend == "gloo":
            if rank == world - 1:
                _report_and_exit(queue, rank, results)  # dies without planning: none may hang
            results["dead_rank"] = _attempt(plan)
    except BaseException:
        results["crash"] = traceback.format_exc()
    _report_and_exit(queue, rank, results)


def _report_and_exit(queue: Any, rank: int, results: dict[str, Any]) -> None:
    queue.put((rank, results))
    queue.close()
    queue.join_thread()  # flush before exiting
    os._exit(0)  # skip process-group teardown, which may wait on the dead rank
