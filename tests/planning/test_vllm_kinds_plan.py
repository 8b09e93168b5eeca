"""A DeepSeek-V4-style model (compressed MLA, its compressor ring, sliding-window MLA on
every layer) planned by pagedkv gives the numbers vLLM 0.33's own planner gives for the
same layers, in a block-outermost layout (vLLM packs the mixed pages) and a layer-outer
one (vLLM unifies them).

The expected values were recorded from vLLM 0.33.0 with (one run per layout)::

    PYTHONPATH=../shared/tools/vllm_peer /tmp/vllm-peer-venv/bin/python \\
        tests/planning/peer/vllm_plan_kinds.py tests/planning/data/deepseek-v4-style.json \\
        --block-size 256 --max-model-len 65536 --kv-bytes 8589934592 --layout BLNHC

(and ``--layout LBNHC``). The config is synthetic (see its ``_comment``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv import engine_config_for, get_kv_cache_specs
from pagedkv.capacity import plan_kv_cache
from pagedkv.planning import plan_kv_cache_configs

CONFIG = Path(__file__).parent / "data" / "deepseek-v4-style.json"
KV_BYTES = 8589934592


def _layers(pattern: str, indices: list[int]) -> list[str]:
    return [pattern.format(i) for i in indices]


SWA, MLA, RING = (
    "model.layers.{}.attn.swa_cache",
    "model.layers.{}.attn",
    ("model.layers.{}.attn.compressor.state_cache"),
)

# layout -> (num_blocks, bytes per block, vLLM's max concurrency at 65,536 tokens, groups
# as (first layer's spec class, layers, block size, bytes per block id)).
VLLM = {
    "BLNHC": (
        42366,
        202752,
        40.69740634005764,
        [
            ("SlidingWindowMLASpec", _layers(SWA, [0, 3, 6]), 32, 98304),
            ("SlidingWindowMLASpec", _layers(SWA, [1, 4, 7]), 32, 98304),
            ("SlidingWindowMLASpec", _layers(SWA, [2, 5]), 32, 65536),
            ("MLAAttentionSpec", _layers(MLA, [2, 3, 4, 5, 6, 7]), 256, 202752),
            ("CircularBufferSpec", _layers(RING, [2, 4, 6]), 8, 98304),
            ("CircularBufferSpec", _layers(RING, [3, 5, 7]), 8, 98304),
        ],
    ),
    "LBNHC": (
        43690,
        196608,
        66.29742033383916,
        [
            ("SlidingWindowMLASpec", _layers(SWA, [0, 3, 6]), 64, 196608),
            ("SlidingWindowMLASpec", _layers(SWA, [1, 4, 7]), 64, 196608),
            ("SlidingWindowMLASpec", _layers(SWA, [2, 5]), 64, 131072),
            ("MLAAttentionSpec", _layers(MLA, [2, 4, 6]), 256, 196608),
            ("CircularBufferSpec", _layers(RING, [2, 4, 6]), 16, 196608),
            ("CircularBufferSpec", _layers(RING, [3, 5, 7]), 16, 196608),
            ("MLAAttentionSpec", _layers(MLA, [3, 5, 7]), 8192, 196608),
        ],
    ),
}


@pytest.mark.parametrize("layout", sorted(VLLM))
def test_deepseek_v4_style_plan_equals_vllms(layout: str) -> None:
    num_blocks, bpb, concurrency, groups = VLLM[layout]
    config = engine_config_for(CONFIG, block_size=256, max_model_len=65536, kv_cache_layout=layout)
    specs = get_kv_cache_specs(CONFIG, block_size=256, config=config)
    planned = plan_kv_cache_configs(config, specs, [KV_BYTES])
    assert (planned.num_blocks, planned.bytes_per_block) == (num_blocks, (bpb,))
    got = []
    for group in planned.configs[0].kv_cache_groups:
        layer_specs = list(group.layer_specs().values())
        first, page = layer_specs[0], sum(s.page_size_bytes for s in layer_specs)
        got.append((type(first).__name__, list(group.layer_names), first.block_size, page))
    assert got == groups
    plan = plan_kv_cache(config, specs, [KV_BYTES])
    assert plan.max_concurrency[0].vllm_max_concurrency == pytest.approx(concurrency, rel=1e-12)


def test_the_block_outer_placement_strides_every_group_by_the_widest() -> None:
    config = engine_config_for(CONFIG, block_size=256, max_model_len=65536, kv_cache_layout="BLNHC")
    specs = get_kv_cache_specs(CONFIG, block_size=256, config=config)
    (kv,) = plan_kv_cache_configs(config, specs, [KV_BYTES]).configs
    assert kv.kv_cache_layout == "BLNHC"
    assert {t.block_stride for t in kv.kv_cache_tensors} == {202752}
    assert {t.size for t in kv.kv_cache_tensors} == {202752 * 42366}


@pytest.mark.slow
def test_pagedkv_plan_takes_the_layout_and_gives_vllms_numbers() -> None:
    env = {**os.environ, "PAGEDKV_TRANSFORMERS": "0"}
    args = [str(CONFIG), "--block-size", "256", "--max-model-len", "65536"]
    args += ["--kv-cache-memory", str(KV_BYTES), "--kv-cache-layout", "BLNHC", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "pagedkv.cli", "plan", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    num_blocks, bpb, _, groups = VLLM["BLNHC"]
    assert (out["num_blocks"], out["bytes_per_block"]) == (num_blocks, bpb)
    assert out["kv_cache_layout"] == "BLNHC"
    assert out["num_groups"] == len(groups)
