"""The policy / host-tier table of docs/simulation.md: one JSON line per run.

    python benchmarks/policy_table.py TRACE MODEL LIMIT GPU|BLOCKS POLICIES HOST_GIBS
    python benchmarks/policy_table.py mooncake_conversation Llama-3.1-8B 1000 28535 \\
        lru,lfu,s3fifo,priority 0,32,128

Each run replays the first LIMIT requests of TRACE on MODEL planned for GPU, or with
BLOCKS KV cache blocks (``setup_from_model``), default scheduler settings, with the
bound; ``hit`` and ``host``
are fractions of prompt tokens, ``bound`` is the device-size bound, ``tiered_bound`` the
bound of one cache as large as both tiers.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from pagedkv.sim.run import simulate
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import setup_from_model
from pagedkv.sim.tiers import host_blocks_for
from pagedkv.sim.traces.bundled import load_trace

# The vLLM peer replay's loop (../shared/tools/vllm_peer/replay.py): 64 running requests,
# 2,048-token chunks, 8,192 tokens a step, every request waiting at t=0.
PEER_SETTINGS = SchedulerSettings(
    max_num_seqs=64, max_num_batched_tokens=8192, max_prefill_chunk=2048, arrivals="all"
)


def main(argv: list[str]) -> None:
    trace_name, model, limit, gpu, policies, hosts = argv
    trace = load_trace(trace_name).head(int(limit))
    sizing = {"num_blocks": int(gpu)} if gpu.isdigit() else {"gpu": gpu}
    setup = dataclasses.replace(setup_from_model(model, **sizing), hash_algo="builtin")
    groups = len(setup.kv_cache_config.kv_cache_groups)
    head = {"model": model, "trace": trace_name, "limit": int(limit), "gpu": gpu}
    print(json.dumps(head | {"num_blocks": setup.num_blocks, "groups": groups}), flush=True)
    for gib in (float(x) for x in hosts.split(",")):
        for policy in policies.split(","):
            run = dataclasses.replace(
                setup, eviction_policy=policy, host_num_blocks=host_blocks_for(setup, gib)
            )
            start = time.perf_counter()
            r = simulate(run, trace, PEER_SETTINGS, bound=True)
            prompt = max(r.prompt_tokens, 1)
            row = {
                "policy": policy,
                "host_gib": gib,
                "host_blocks": run.host_num_blocks,
                "hit": round(r.hit_rate, 6),
                "host": round(r.host_hit_tokens / prompt, 6),
                "bound": r.bound_hit_rate,
                "tiered_bound": None
                if r.tiered_bound_hit_tokens is None
                else round(r.tiered_bound_hit_tokens / prompt, 6),
                "preemptions": r.preemptions,
                "seconds": round(time.perf_counter() - start, 1),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
