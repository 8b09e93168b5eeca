"""Greedy generation on a tiny model: pagedkv (``pagedkv.hf``) against transformers'
``generate()`` (one batch, and one prompt at a time) and transformers' own continuous
batching (``generate_batch``), alternated run by run in one process; medians over
``--repeat`` runs. JSON on stdout.

The workload: ``--prompts`` prompts that share a ``--prefix-tokens`` prefix (a system
prompt) and differ in a ``--suffix-tokens`` suffix, ``--new-tokens`` greedy tokens each, all
given at once. Batched ``generate()`` runs them as one batch (equal lengths, no padding);
continuous batching and pagedkv schedule them (pagedkv: ``--max-num-seqs`` at a time under a
``--max-num-batched-tokens`` budget, prefix caching on, so it computes the shared prefix
once). Every engine's tokens are checked equal to batched ``generate()``'s.

Times are process CPU seconds (every thread of the process, torch at one thread): on a
shared machine they move far less with other load than wall-clock seconds, which are
reported beside them.

    python benchmarks/bench_generate.py [--model NAME] [--repeat R] [--prompts N]
        [--prefix-tokens P] [--suffix-tokens S] [--new-tokens T] [--max-num-seqs M]
        [--max-num-batched-tokens B] [--engines a,b,...]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pagedkv.hf import PagedGenerator
from pagedkv.hf.load import load_tiny_model

Batch = list[list[int]]
Outputs = list[tuple[int, ...]]


def prompts(num: int, prefix_tokens: int, suffix_tokens: int, vocab: int) -> Batch:
    rng = random.Random(0)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_tokens)]
    return [prefix + [rng.randrange(1, vocab) for _ in range(suffix_tokens)] for _ in range(num)]


def run_pagedkv(model: Any, batch: Batch, new_tokens: int, args: argparse.Namespace) -> Outputs:
    engine = PagedGenerator(
        model,
        num_blocks=2048,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=True,
    )
    output = engine.generate(batch, new_tokens, arrivals_per_step=len(batch))
    run_pagedkv.figures = output.figures  # type: ignore[attr-defined]
    return list(output.token_ids)


@torch.no_grad()
def run_generate(model: Any, batch: Batch, new_tokens: int, args: argparse.Namespace) -> Outputs:
    model.set_attn_implementation("sdpa")
    ids = torch.tensor(batch)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return [tuple(int(t) for t in row[len(batch[0]) :]) for row in out]


def run_generate_per_prompt(
    model: Any, batch: Batch, new_tokens: int, args: argparse.Namespace
) -> Outputs:
    return [run_generate(model, [prompt], new_tokens, args)[0] for prompt in batch]


def run_continuous(model: Any, batch: Batch, new_tokens: int, args: argparse.Namespace) -> Outputs:
    from transformers import GenerationConfig

    model.set_attn_implementation("paged|sdpa")
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=-1,
        pad_token_id=0,
        max_batch_tokens=args.max_num_batched_tokens,
    )
    results = model.generate_batch(inputs=batch, generation_config=config, warmup=False)
    ordered = sorted(results.values(), key=lambda r: int(r.request_id.rsplit("_", 1)[-1]))
    return [tuple(r.generated_tokens) for r in ordered]


ENGINES: dict[str, Callable[[Any, Batch, int, argparse.Namespace], Outputs]] = {
    "pagedkv": run_pagedkv,
    "generate": run_generate,
    "generate_per_prompt": run_generate_per_prompt,
    "continuous_batching": run_continuous,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--suffix-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_tiny_model(args.model, seed=0, vocab_size=512)
    model.generation_config.eos_token_id = None  # every prompt runs its full length
    batch = prompts(args.prompts, args.prefix_tokens, args.suffix_tokens, 512)
    names = args.engines.split(",")
    seconds: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, Outputs] = {}
    for _ in range(args.repeat):
        for name in names:
            start, start_wall = time.process_time(), time.perf_counter()
            outputs[name] = ENGINES[name](model, batch, args.new_tokens, args)
            seconds[name].append(time.process_time() - start)
            wall[name].append(time.perf_counter() - start_wall)
    reference = outputs.get("generate")
    for name, got in outputs.items():
        if reference is not None and got != reference:
            raise SystemExit(f"{name}: tokens differ from generate()")
    generated = args.prompts * args.new_tokens
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    figures = getattr(run_pagedkv, "figures", None)
    report: dict[str, Any] = {
        "benchmark": "generate",
        "model": f"{args.model} --tiny (vocab 512, float32, 1 thread)",
        "prompts": args.prompts,
        "prefix_tokens": args.prefix_tokens,
        "suffix_tokens": args.suffix_tokens,
        "new_tokens": args.new_tokens,
        "repeat": args.repeat,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "engines": {
            name: {
                "cpu_seconds_median": medians[name],
                "wall_seconds_median": statistics.median(wall[name]),
                "tokens_per_cpu_s": generated / medians[name],
            }
            for name in names
        },
    }
    if figures is not None:
        report["pagedkv_prompt_tokens"] = figures.num_prompt_tokens
        report["pagedkv_computed_tokens"] = figures.num_computed_tokens
        report["pagedkv_hit_tokens"] = figures.num_hit_tokens
    if "pagedkv" in medians:
        report["speedup"] = {
            f"pagedkv_vs_{name}": medians[name] / medians["pagedkv"]
            for name in names
            if name != "pagedkv"
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
