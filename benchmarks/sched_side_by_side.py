"""vLLM 0.33's own scheduler and pagedkv's simulator on one trace, compared step by step.

    python benchmarks/sched_side_by_side.py --model llama --num-blocks 10000 [--limit 1000]
        [--trace mooncake_conversation] [--variant fcfs|priority|long-prefill|...]
        [--max-num-seqs 1024] [--max-num-batched-tokens 8192] [--json]

``--model``, ``--num-blocks`` and ``--variant`` repeat; every combination is one run.
Variants: ``fcfs`` (vLLM's default), ``priority`` (the priority policy, request ``i``
with priority ``i % 3``), ``long-prefill`` (``long_prefill_token_threshold`` 2048),
``long-prefill-adaptive`` (512, adaptive).

Runs in the vLLM peer venv (``../shared/tools/vllm_peer/setup.sh``; ``$PEER_VENV``,
default ``/tmp/vllm-peer-venv``): started with any other Python it starts itself again
there, with this checkout's ``src/`` and the peer tools (``$PEER_DIR``, default
``shared/tools/vllm_peer`` beside the checkout or
one level up) on ``sys.path``; nothing is installed.

vLLM's side is ``vllm.v1.core.sched.scheduler.Scheduler`` built from the peer tools'
neutral model description (``models/llama-3.1-8b.json``, ``gemma-3-27b-like.json``,
``jamba-like.json``) with ``num_gpu_blocks_override``, driven with a fake model output
that samples the trace's output tokens, as vLLM's own scheduler tests do. pagedkv's side
is ``pagedkv.sim`` on a KV cache config made from vLLM's planned groups (same block
count, same specs). Both share the trace's token ids, arrival times and the simulated
clock (``step_base_s + step_per_token_s * scheduled tokens``): at each step both admit the
requests that have arrived, schedule, and apply the output.

Compared at every step: the requests scheduled in order with the first position and the
number of tokens of each (so prefix-cache hits and chunking), the requests preempted, the
requests that finished. Prints JSON: steps compared, whether all were identical, the first
difference if any, and totals for both sides.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parent / "src")
VENV = os.environ.get("PEER_VENV", "/tmp/vllm-peer-venv")
_PEER_CANDIDATES = [up / "shared" / "tools" / "vllm_peer" for up in HERE.parents[1:3]]
PEER = os.environ.get(
    "PEER_DIR", str(next((p for p in _PEER_CANDIDATES if p.is_dir()), _PEER_CANDIDATES[0]))
)
MODELS = {
    "llama": "llama-3.1-8b.json",
    "gemma": "gemma-3-27b-like.json",
    "jamba": "jamba-like.json",
}


def _in_peer_venv() -> None:
    """Run under the vLLM venv with pagedkv's src and the peer tools importable."""
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        python = os.path.join(VENV, "bin", "python")
        if not os.path.exists(python):
            sys.exit(f"no vLLM peer venv at {VENV} (run shared/tools/vllm_peer/setup.sh)")
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
        os.execve(python, [python, os.path.abspath(__file__), *sys.argv[1:]], env)
    for path in (PEER, SRC):
        if path not in sys.path:
            sys.path.insert(0, path)


_in_peer_venv()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from typing import Any  # noqa: E402

STEP_BASE_S = 0.012
STEP_PER_TOKEN_S = 25e-6
# variant -> (scheduling policy, priorities, long_prefill_token_threshold, adaptive)
VARIANTS = {
    "fcfs": ("fcfs", "none", 0, False),
    "priority": ("priority", "mod3", 0, False),
    "long-prefill": ("fcfs", "none", 2048, False),
    "long-prefill-adaptive": ("fcfs", "none", 512, True),
}


def _dtype(value: Any) -> str:
    return str(value).removeprefix("torch.")


class Layout:
    """vLLM's planned scheduler KV cache config for a model, and pagedkv's copy of it."""

    def __init__(self, model: str, num_blocks: int, args: argparse.Namespace) -> None:
        import peer_common as pc

        desc = pc.load_model(os.path.join(PEER, "models", MODELS[model]))
        self.model_name = desc["name"]
        vllm_config, specs, _ = pc.build(
            desc,
            block_size=16,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            enable_prefix_caching=True,
            num_gpu_blocks_override=num_blocks,
        )
        sched_config = vllm_config.scheduler_config
        sched_config.long_prefill_token_threshold = args.long_prefill_token_threshold
        sched_config.long_prefill_token_threshold_adaptive = args.adaptive
        sched_config.policy = args.scheduling_policy
        _, kv_config, self.block_size, self.hash_block_size = pc.plan(vllm_config, specs, 1 << 62)
        if kv_config.num_blocks != num_blocks:
            sys.exit(f"vLLM planned {kv_config.num_blocks} blocks, not {num_blocks}")
        self.vllm_config = vllm_config
        self.vllm_kv_config = kv_config
        self.num_blocks = num_blocks
        self.max_model_len = vllm_config.model_config.max_model_len
        self.cache_block_size = vllm_config.cache_config.block_size
        self.mamba_cache_mode = vllm_config.cache_config.mamba_cache_mode

    def pagedkv_setup(self) -> Any:
        import pagedkv as pk
        from pagedkv.sim.setup import SimSetup

        groups = [
            pk.KVCacheGroupSpec(
                layer_names=tuple(g.layer_names), kv_cache_spec=_pagedkv_spec(g.kv_cache_spec)
            )
            for g in self.vllm_kv_config.kv_cache_groups
        ]
        kv_config = pk.KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=(),
            kv_cache_groups=tuple(groups),
            max_model_len=self.max_model_len,
        )
        options: dict[str, Any] = {
            "block_size": self.cache_block_size,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": True,
        }
        if any(type(g.kv_cache_spec).__name__ == "MambaSpec" for g in groups):
            options["mamba_cache_mode"] = self.mamba_cache_mode
        config = pk.EngineConfig.create(**options)
        return SimSetup(kv_cache_config=kv_config, config=config, model_name=self.model_name)

    def vllm_scheduler(self) -> Any:
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        return Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=self.vllm_kv_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            log_stats=False,
        )


def _pagedkv_spec(spec: Any) -> Any:
    import pagedkv as pk

    kind = type(spec).__name__
    common = {
        "block_size": spec.block_size,
        "page_size_padded": spec.page_size_padded,
    }
    if kind == "MambaSpec":
        made = pk.MambaSpec(
            **common,
            shapes=spec.shapes,
            dtypes=tuple(_dtype(d) for d in spec.dtypes),
            mamba_type=spec.mamba_type.name.lower(),
            mamba_cache_mode=spec.mamba_cache_mode,
        )
    else:
        common.update(
            num_kv_heads=spec.num_kv_heads,
            head_size=spec.head_size,
            head_size_v=spec.head_size_v,
            dtype=_dtype(spec.dtype),
            max_tp_shards=spec.max_tp_shards,
        )
        if kind == "FullAttentionSpec":
            made = pk.FullAttentionSpec(**common)
        elif kind == "SlidingWindowSpec":
            made = pk.SlidingWindowSpec(
                **common,
                sliding_window=spec.sliding_window,
                extra_retained_tokens=spec.extra_retained_tokens,
            )
        else:
            sys.exit(f"no pagedkv spec for vLLM's {kind} in this tool")
    if made.page_size_bytes != spec.page_size_bytes:
        sys.exit(f"{kind}: page sizes differ ({made.page_size_bytes} vs {spec.page_size_bytes})")
    return made


Step = tuple[tuple[tuple[int, int, int], ...], tuple[int, ...], tuple[int, ...]]


class VllmDriver:
    """vLLM's Scheduler with arrivals on pagedkv's simulated clock and a fake model that
    samples each request's trace output tokens."""

    def __init__(self, layout: Layout, trace: Any) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        from pagedkv.sim.traces.tokens import output_tokens, prompt_tokens

        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(layout.hash_block_size, hash_fn)
        self.sched = layout.vllm_scheduler()
        self.max_len = layout.max_model_len
        self.pending: deque[tuple[int, Any, int]] = deque()
        self.outputs: dict[str, list[int]] = {}
        self.generated: dict[str, int] = {}
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.clock_s = 0.0
        self.rejected = 0
        for index, source in enumerate(trace.requests):
            num_prompt = source.num_prompt_tokens
            if num_prompt < 1 or num_prompt >= self.max_len:
                self.rejected += 1
                continue
            target = max(1, min(source.num_output_tokens, self.max_len - num_prompt))
            self.pending.append((index, source, target))

    @property
    def has_work(self) -> bool:
        return bool(self.pending) or self.sched.get_num_unfinished_requests() > 0

    def _arrive(self) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        pending = self.pending
        if not self.sched.get_num_unfinished_requests() and pending:
            self.clock_s = max(self.clock_s, pending[0][1].arrival_s)
        while pending and pending[0][1].arrival_s <= self.clock_s:
            index, source, target = pending.popleft()
            request_id = str(index)
            self.outputs[request_id] = self.output_tokens(source)[:target]
            self.generated[request_id] = 0
            self.sched.add_request(
                Request(
                    request_id=request_id,
                    prompt_token_ids=self.prompt_tokens(source),
                    sampling_params=SamplingParams(max_tokens=target, ignore_eos=True),
                    pooling_params=None,
                    arrival_time=source.arrival_s,
                    priority=source.priority,
                    block_hasher=self.hasher,
                )
            )

    def step(self) -> Step:
        from vllm.v1.outputs import ModelRunnerOutput

        self._arrive()
        sched = self.sched
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        scheduled = []
        sampled: list[list[int]] = []
        for rid in ids:
            req = sched.requests[rid]
            num = out.num_scheduled_tokens[rid]
            scheduled.append((int(rid), req.num_computed_tokens - num, num))
            if req.num_computed_tokens >= req.num_tokens:
                sampled.append([self.outputs[rid][self.generated[rid]]])
                self.generated[rid] += 1
            else:
                sampled.append([])
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        sched.update_from_output(out, output)
        finished = tuple(sorted(int(rid) for rid in ids if rid not in sched.requests))
        preempted = tuple(sorted(int(rid) for rid in (out.preempted_req_ids or ())))
        self.clock_s += STEP_BASE_S + STEP_PER_TOKEN_S * sum(n for _, _, n in scheduled)
        if not ids and sched.get_num_unfinished_requests() and not self.pending:
            raise RuntimeError("vLLM's scheduler made no progress (a request never fits)")
        return tuple(scheduled), preempted, finished


class PagedkvDriver:
    """pagedkv's EngineLoop, with each step's schedule and preemptions recorded."""

    def __init__(self, layout: Layout, trace: Any, settings: Any) -> None:
        setup = layout.pagedkv_setup()
        self.loop = setup.simulator(settings).loop(trace)
        scheduler = self.loop.scheduler
        self.preempted: list[int] = []
        self.scheduled: list[tuple[int, int, int]] = []
        scheduler.on_preempt = lambda seq: self.preempted.append(seq.index)
        schedule = scheduler.schedule

        def recording_schedule() -> Any:
            picked = schedule()
            self.scheduled = [(s.index, s.req.num_computed_tokens, n) for s, n in picked]
            return picked

        scheduler.schedule = recording_schedule  # type: ignore[method-assign]

    @property
    def has_work(self) -> bool:
        return self.loop.has_work

    def step(self) -> Step:
        self.preempted.clear()
        outcome = self.loop.step()
        preempted = tuple(sorted(self.preempted))
        return tuple(self.scheduled), preempted, tuple(sorted(outcome.finished))


def _first_difference(step: int, v: Step, p: Step) -> dict[str, Any]:
    diff: dict[str, Any] = {"step": step}
    for name, a, b in zip(("scheduled", "preempted", "finished"), v, p, strict=True):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diff[name] = {
                "index": at,
                "vllm": [list(x) if isinstance(x, tuple) else x for x in a[at : at + 4]],
                "pagedkv": [list(x) if isinstance(x, tuple) else x for x in b[at : at + 4]],
                "lengths": [len(a), len(b)],
            }
    return diff


def compare(args: argparse.Namespace, model: str, num_blocks: int) -> dict[str, Any]:
    from pagedkv.sim.scheduling.scheduler import SchedulerSettings
    from pagedkv.sim.traces.bundled import load_trace

    trace = load_trace(args.trace, limit=args.limit)
    if args.priorities == "mod3":
        requests = tuple(r._replace(priority=i % 3) for i, r in enumerate(trace.requests))
        trace = trace._replace(requests=requests)
    layout = Layout(model, num_blocks, args)
    settings = SchedulerSettings(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=args.adaptive,
        policy=args.scheduling_policy,
        arrivals="timestamp",
        step_base_s=STEP_BASE_S,
        step_per_token_s=STEP_PER_TOKEN_S,
    )
    vllm, paged = VllmDriver(layout, trace), PagedkvDriver(layout, trace, settings)
    totals = {
        side: {
            "steps": 0,
            "preemptions": 0,
            "scheduled_tokens": 0,
            "prompt_tokens": 0,
            "hit_tokens": 0,
            "finish_order": [],
        }
        for side in ("vllm", "pagedkv")
    }
    seen: dict[str, set[int]] = {"vllm": set(), "pagedkv": set()}
    steps = 0
    difference = None
    started = time.perf_counter()
    while vllm.has_work or paged.has_work:
        if vllm.has_work != paged.has_work:
            difference = {"step": steps + 1, "has_work": [vllm.has_work, paged.has_work]}
            break
        steps += 1
        results = {"vllm": vllm.step(), "pagedkv": paged.step()}
        for side, (scheduled, preempted, finished) in results.items():
            total = totals[side]
            total["steps"] += 1
            total["preemptions"] += len(preempted)
            total["scheduled_tokens"] += sum(n for _, _, n in scheduled)
            for index, start, _ in scheduled:
                if index not in seen[side]:  # first admission: its prefix-cache hit
                    seen[side].add(index)
                    total["hit_tokens"] += start
                    total["prompt_tokens"] += trace.requests[index].num_prompt_tokens
            total["finish_order"] += finished
        if args.progress and steps % args.progress == 0:
            print(f"step {steps}: {len(seen['vllm'])} requests admitted", file=sys.stderr)
        if results["vllm"] != results["pagedkv"]:
            difference = _first_difference(steps, results["vllm"], results["pagedkv"])
            break
    same_order = totals["vllm"]["finish_order"] == totals["pagedkv"]["finish_order"]
    for total in totals.values():
        total["requests_finished"] = len(total.pop("finish_order"))
        total["hit_rate"] = round(total["hit_tokens"] / max(1, total["prompt_tokens"]), 4)
    return {
        "model": layout.model_name,
        "groups": [
            f"{type(g.kv_cache_spec).__name__}x{len(g.layer_names)}"
            for g in layout.vllm_kv_config.kv_cache_groups
        ],
        "num_blocks": num_blocks,
        "trace": trace.name,
        "requests": len(trace.requests),
        "settings": {
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "scheduling_policy": args.scheduling_policy,
            "priorities": args.priorities,
            "long_prefill_token_threshold": args.long_prefill_token_threshold,
            "adaptive": args.adaptive,
        },
        "steps_compared": steps,
        "identical": difference is None and same_order,
        "same_finish_order": same_order,
        "first_difference": difference,
        "vllm": totals["vllm"],
        "pagedkv": totals["pagedkv"],
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), action="append")
    ap.add_argument("--num-blocks", type=int, action="append", required=True)
    ap.add_argument("--trace", default="mooncake_conversation")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--variant", choices=sorted(VARIANTS), action="append")
    ap.add_argument("--json", action="store_true", help="one JSON document for all runs")
    ap.add_argument(
        "--progress", type=int, default=0, metavar="STEPS", help="report on stderr every STEPS"
    )
    args = ap.parse_args(argv)
    runs = []
    for model in args.model or ["llama"]:
        for num_blocks in args.num_blocks:
            for variant in args.variant or ["fcfs"]:
                policy, priorities, threshold, adaptive = VARIANTS[variant]
                args.scheduling_policy, args.priorities = policy, priorities
                args.long_prefill_token_threshold, args.adaptive = threshold, adaptive
                run = compare(args, model, num_blocks) | {"variant": variant}
                runs.append(run)
                if not args.json:
                    print(json.dumps(run), flush=True)
    if args.json:
        print(json.dumps(runs, indent=1))
    return 0 if all(r["identical"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
