"""Greedy generation through pagedkv (``pagedkv.hf``) on a tiny model, with and without
prefix caching: tokens per second and the share of prefill tokens the cache skipped.

Prompts share a long prefix (a system prompt) and differ in a short suffix; one arrives
per step. Both runs use the same model, cache and scheduler settings, alternating, in
one process; medians over ``--repeat`` runs. JSON on stdout.

    python benchmarks/bench_generate.py [--model NAME] [--repeat R] [--prompts N]
        [--prefix-tokens P] [--suffix-tokens S] [--new-tokens T]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch

from pagedkv.hf import PagedGenerator
from pagedkv.hf.load import load_tiny_model


def prompts(num: int, prefix_tokens: int, suffix_tokens: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_tokens)]
    return [prefix + [rng.randrange(1, vocab) for _ in range(suffix_tokens)] for _ in range(num)]


def run(model: Any, batch: list[list[int]], new_tokens: int, caching: bool) -> dict[str, Any]:
    engine = PagedGenerator(
        model,
        num_blocks=1024,
        max_num_batched_tokens=256,
        max_num_seqs=8,
        enable_prefix_caching=caching,
    )
    start = time.perf_counter()
    output = engine.generate(batch, new_tokens, arrivals_per_step=1)
    seconds = time.perf_counter() - start
    figures = output.figures
    generated = sum(len(t) for t in output.token_ids)
    return {
        "seconds": seconds,
        "tokens_per_s": generated / seconds,
        "generated_tokens": generated,
        "prompt_tokens": figures.num_prompt_tokens,
        "hit_tokens": figures.num_hit_tokens,
        "computed_tokens": figures.num_computed_tokens,
        "prefill_skipped_fraction": figures.num_hit_tokens / figures.num_prompt_tokens,
        "steps": figures.num_steps,
        "outputs": output.token_ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--suffix-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_tiny_model(args.model, seed=0, vocab_size=512)
    batch = prompts(args.prompts, args.prefix_tokens, args.suffix_tokens, 512)
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for _ in range(args.repeat):
        for caching in (False, True):
            runs[caching].append(run(model, batch, args.new_tokens, caching))
    if runs[True][0]["outputs"] != runs[False][0]["outputs"]:
        raise SystemExit("outputs differ with and without prefix caching")
    summary = {}
    for caching, name in ((True, "prefix_caching"), (False, "no_prefix_caching")):
        rows = runs[caching]
        summary[name] = {
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows),
            "seconds_median": statistics.median(r["seconds"] for r in rows),
            **{k: rows[0][k] for k in ("prompt_tokens", "hit_tokens", "computed_tokens")},
            "prefill_skipped_fraction": rows[0]["prefill_skipped_fraction"],
        }
    report = {
        "benchmark": "generate",
        "model": f"{args.model} --tiny (vocab 512, float32, 1 thread)",
        "prompts": args.prompts,
        "prefix_tokens": args.prefix_tokens,
        "suffix_tokens": args.suffix_tokens,
        "new_tokens": args.new_tokens,
        "repeat": args.repeat,
        **summary,
        "speedup_with_prefix_caching": summary["prefix_caching"]["tokens_per_s_median"]
        / summary["no_prefix_caching"]["tokens_per_s_median"],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
