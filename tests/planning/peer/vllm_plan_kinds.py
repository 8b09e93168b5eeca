"""vLLM 0.33's own planner on the layers pagedkv's DeepSeek-V4 adapter describes.

Run with vLLM's environment and the shared peer tools on the path (not part of the test
suite; its output is recorded in tests/planning/test_vllm_kinds_plan.py):

    PYTHONPATH=../shared/tools/vllm_peer /tmp/vllm-peer-venv/bin/python \\
        tests/planning/peer/vllm_plan_kinds.py tests/planning/data/deepseek-v4-style.json \\
        --block-size 256 --max-model-len 65536 --kv-bytes 8589934592 --layout BLNHC

The specs restate what vLLM 0.33's DeepSeek-V4.1 layers report for an unquantised (bf16)
cache: the sliding-window cache (DeepseekV4SWACache, block 32, alignment 512), the
compressed latent (MLAAttentionSpec with tokens_per_state = the ratio) and the compressor
ring (CompressorStateCache: 8 rows of 2 x head_dim fp32).
"""

from __future__ import annotations

import argparse
import json

import peer_common as pc
import torch


def vllm_specs(config: dict, block_size: int) -> dict:
    from vllm.v1.kv_cache_interface import (
        CircularBufferSpec,
        MLAAttentionSpec,
        SlidingWindowMLASpec,
    )

    head = config["head_dim"]
    specs = {}
    for i in range(config["num_hidden_layers"]):
        ratio = config["compress_ratios"][i]
        prefix = f"model.layers.{i}.attn"
        specs[f"{prefix}.swa_cache"] = SlidingWindowMLASpec(
            block_size=32,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=head,
            dtype=torch.bfloat16,
            sliding_window=config["sliding_window"],
            cache_dtype_str="auto",
            alignment=512,
            model_version="deepseek_v4",
        )
        if ratio <= 1:
            continue
        specs[prefix] = MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=head,
            dtype=torch.bfloat16,
            tokens_per_state=ratio,
            cache_dtype_str="auto",
            alignment=512,
            model_version="deepseek_v4",
        )
        specs[f"{prefix}.compressor.state_cache"] = CircularBufferSpec(
            block_size=8, num_kv_heads=1, head_size=2 * head, head_size_v=0, dtype=torch.float32
        )
    return specs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=65536)
    ap.add_argument("--kv-bytes", type=int, required=True)
    ap.add_argument("--layout", default="BLNHC")
    args = ap.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    placeholder = {
        "name": "placeholder",
        "max_model_len": args.max_model_len,
        "layers": [{"name": "x", "type": "full", "num_kv_heads": 1, "head_size": 64,
                    "dtype": "bfloat16"}],
    }  # fmt: skip
    vllm_config, _, _ = pc.build(placeholder, block_size=args.block_size, layout=args.layout)
    worker, sched, sched_bs, hash_bs = pc.plan(
        vllm_config, vllm_specs(config, args.block_size), args.kv_bytes
    )
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    groups = []
    for g in worker.kv_cache_groups:
        spec = g.kv_cache_spec
        layers = getattr(spec, "kv_cache_specs", None) or dict.fromkeys(g.layer_names, spec)
        first = next(iter(layers.values()))
        groups.append(
            [
                type(first).__name__,
                list(g.layer_names),
                first.block_size,
                sum(s.page_size_bytes for s in layers.values()),
            ]
        )
    sizes = {t.size for t in worker.kv_cache_tensors}
    print(
        json.dumps(
            {
                "num_blocks": worker.num_blocks,
                "bytes_per_block": sizes.pop() // worker.num_blocks,
                "scheduler_block_size": sched_bs,
                "hash_block_size": hash_bs,
                "max_concurrency": get_max_concurrency_for_kv_cache_config(vllm_config, sched),
                "groups": groups,
            }
        )
    )


if __name__ == "__main__":
    main()
