"""Gated-DeltaNet hybrids (Qwen3.5, Qwen3-Next) planned by pagedkv give the numbers vLLM
0.33's own code gives for the same layers: its hybrid block-size alignment (in align
mode the attention block is a multiple of the GDN prefill kernel's 64-token checkpoint
step), its Mamba prefill checkpoint blocks and grid, and its planner.

The expected values were recorded from vLLM 0.33.0 with (one run per model and mode)::

    PYTHONPATH=../shared/tools/vllm_peer /tmp/vllm-peer-venv/bin/python \\
        tests/planning/peer/vllm_plan_hybrid.py src/pagedkv/data/models/Qwen3.5-27B/config.json \\
        --max-model-len 32768 --kv-bytes 8589934592 [--no-prefix-caching]

(block size 16, FlashAttention as the attention backend, as vLLM serves them on Hopper)."""

from __future__ import annotations

import pytest

from pagedkv import engine_config_for, get_kv_cache_specs
from pagedkv.capacity import plan_kv_cache
from pagedkv.planning import plan_kv_cache_configs
from pagedkv.specs import FullAttentionSpec, MambaSpec

KV_BYTES = 8589934592
MAX_MODEL_LEN = 32768

# (model, prefix caching) -> (attention block size, num_blocks, bytes per block, vLLM's
# max concurrency at 32,768 tokens, the GDN specs' prefill checkpoint blocks and grid).
VLLM = {
    ("Qwen3.5-27B", True): (832, 157, 54525952, 3.204081632653061, 1, 832),
    ("Qwen3.5-27B", False): (784, 167, 51380224, 3.7111111111111112, 0, None),
    ("Qwen3.5-35B-A3B", True): (1088, 385, 22282240, 9.625, 1, 1088),
    ("Qwen3.5-35B-A3B", False): (1056, 397, 21626880, 11.342857142857143, 0, None),
    ("Qwen3-Next-80B-A3B-Instruct", True): (576, 606, 14155776, 9.181818181818182, 1, 576),
    ("Qwen3-Next-80B-A3B-Instruct", False): (544, 642, 13369344, 10.03125, 0, None),
}
# Every run: 3 GDN groups and 1 attention group, every page the attention page.
GROUPS = ["MambaSpec", "MambaSpec", "MambaSpec", "FullAttentionSpec"]


@pytest.mark.parametrize(("model", "prefix_caching"), sorted(VLLM))
def test_gdn_hybrid_plan_equals_vllms(model: str, prefix_caching: bool) -> None:
    block, num_blocks, bpb, concurrency, ckpt_blocks, grid = VLLM[model, prefix_caching]
    config = engine_config_for(
        model, block_size=16, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=prefix_caching
    )
    specs = get_kv_cache_specs(model, block_size=16, config=config)
    planned = plan_kv_cache_configs(config, specs, [KV_BYTES])
    assert (planned.num_blocks, planned.bytes_per_block) == (num_blocks, (bpb,))
    groups = planned.configs[0].kv_cache_groups
    assert [type(g.kv_cache_spec).__name__ for g in groups] == GROUPS
    attention = groups[-1].kv_cache_spec
    assert isinstance(attention, FullAttentionSpec)
    assert attention.block_size == block
    per_layer = bpb // len(groups[-1].layer_names)  # every group fills the block's slots
    assert attention.page_size_bytes == per_layer
    for group in groups[:-1]:
        state = group.kv_cache_spec
        assert isinstance(state, MambaSpec)
        assert state.page_size_bytes == per_layer
        assert (state.num_prefill_checkpoint_blocks, state.prefill_checkpoint_alignment) == (
            ckpt_blocks,
            grid,
        )
        if prefix_caching:
            assert state.block_size == block
    plan = plan_kv_cache(config, specs, [KV_BYTES])
    assert plan.max_concurrency[0].vllm_max_concurrency == pytest.approx(concurrency, rel=1e-12)


def test_align_mode_rounds_the_block_to_the_gdn_checkpoint_step() -> None:
    """Without the 64-token step the attention block would be 784 (49 x 16): vLLM's
    kernel alignment, lcm(16, 64), makes it 832 (13 x 64)."""
    aligned, _, _, _, _, _ = VLLM["Qwen3.5-27B", True]
    unaligned, _, _, _, _, _ = VLLM["Qwen3.5-27B", False]
    assert (aligned % 64, unaligned % 64) == (0, 16)
