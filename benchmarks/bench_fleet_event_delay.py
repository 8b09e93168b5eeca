"""What late KV events cost a prefix-aware router: the fleet simulator on a bundled trace
with the events reaching the router's index some simulated time after each step.

Prints JSON: hit rate, imbalance and mean queue delay for each event delay, and for the
oracle router (which reads every cache directly) and round robin, same trace and fleet.

    python benchmarks/bench_fleet_event_delay.py [--trace T] [--limit N] [--replicas R]
        [--delays 0,0.5,2,10,60] [--workers K]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from functools import partial

from pagedkv.sim.fleet.replicas import simulate_fleet
from pagedkv.sim.fleet.result import FleetResult
from pagedkv.sim.jobs import run_jobs
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import setup_from_model
from pagedkv.sim.traces.bundled import load_trace


def _row(result: FleetResult) -> dict[str, object]:
    return {
        "router": result.router,
        "event_delay_s": result.event_delay_s,
        "hit_rate": round(result.hit_rate, 5),
        "imbalance": round(result.imbalance, 4),
        "mean_queue_delay_steps": round(result.mean_queue_delay_steps, 3),
        "preemptions": result.preemptions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="mooncake_conversation")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--delays", default="0,0.5,2,10,60")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()

    setup = dataclasses.replace(setup_from_model(args.model, gpu=args.gpu), hash_algo="builtin")
    trace = load_trace(args.trace).head(args.limit)
    settings = SchedulerSettings(arrivals="timestamp")
    delays = [float(d) for d in args.delays.split(",")]
    jobs = [
        (
            partial(simulate_fleet, event_delay_s=d),
            (setup, trace, args.replicas, "prefix", settings),
        )
        for d in delays
    ]
    jobs += [
        (simulate_fleet, (setup, trace, args.replicas, r, settings))
        for r in ("oracle", "round-robin")
    ]
    results = run_jobs(jobs, workers=args.workers)
    print(
        json.dumps(
            {
                "trace": trace.name,
                "requests": len(trace.requests),
                "replicas": args.replicas,
                "blocks_per_replica": setup.num_blocks,
                "rows": [_row(r) for r in results],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
