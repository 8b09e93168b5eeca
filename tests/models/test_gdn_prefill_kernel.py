"""The gated-DeltaNet prefill kernel, and with it the GDN specs' prefill checkpoints,
follow the GPU as in vLLM 0.33.

vLLM's rule (``_resolve_gdn_prefill_backend``, model_executor/layers/mamba/gdn/
qwen_gdn_linear_attn.py): FlashInfer on compute capability 9.0; on 10.x and 12.x when
``linear_key_head_dim`` is 128 and the CUDA runtime is 13 or later; Triton/FLA on any
other CUDA device and off CUDA. The GDN layer sets its checkpoint alignment (64 tokens)
only when the active backend is FlashInfer; without one the spec has no prefill
checkpoint block and align mode does not round the block to 64.
"""

from __future__ import annotations

import pytest

from pagedkv import EngineConfig, plan
from pagedkv.errors import ConfigError
from pagedkv.models import get_gpu, get_kv_cache_specs
from pagedkv.models.gdn_kernel import gdn_key_head_dim, gdn_prefill_kernel
from pagedkv.specs import MambaSpec


@pytest.mark.parametrize(
    ("gpu", "key_head_dim", "cuda", "kernel"),
    [
        ("H100-80GB", 128, 13, "flashinfer"),
        ("H200-141GB", 256, 12, "flashinfer"),  # Hopper: no further condition
        ("A100-80GB", 128, 13, "triton"),
        ("L40S", 128, 13, "triton"),
        ("B200", 128, 13, "flashinfer"),
        ("B300", 128, 13, "flashinfer"),
        ("B200", 256, 13, "triton"),
        ("B200", 128, 12, "triton"),
        ("RTX-5090", 128, 13, "flashinfer"),
        ("MI300X", 128, 13, "triton"),
    ],
)
def test_the_kernel_follows_vllms_rule(gpu: str, key_head_dim: int, cuda: int, kernel: str) -> None:
    assert gdn_prefill_kernel(get_gpu(gpu), key_head_dim, cuda) == kernel


def test_the_gpu_table_gives_nvidia_compute_capabilities() -> None:
    assert get_gpu("A100-40GB").compute_capability == (8, 0)
    assert get_gpu("H100-80GB").compute_capability == (9, 0)
    assert get_gpu("RTX-5090").compute_capability == (12, 0)
    assert get_gpu("MI300X").compute_capability is None


def _states(gpu: str) -> set[tuple[int, int | None]]:
    result = plan("Qwen3.5-27B", gpu)
    assert gdn_key_head_dim(result.layout) == 128
    return {
        (s.num_prefill_checkpoint_blocks, s.prefill_checkpoint_alignment)
        for s in result.kv_cache_specs[0].values()
        if isinstance(s, MambaSpec)
    }


def test_only_hopper_and_blackwell_plans_take_gdn_prefill_checkpoints() -> None:
    assert _states("H100-80GB") == {(1, 64)}
    assert _states("B200") == {(1, 64)}
    assert _states("A100-80GB") == {(0, None)}


def test_without_flashinfer_align_mode_keeps_the_16_token_grid() -> None:
    """Qwen3.5-27B in align mode: FlashInfer's 64-token step rounds the hybrid block
    to 832 on Hopper; on an A100 the block stays 784 (49 x 16)."""
    blocks = {}
    for gpu in ("H100-80GB", "A100-80GB"):
        groups = plan("Qwen3.5-27B", gpu).kv_cache.configs[0].kv_cache_groups
        blocks[gpu] = {g.kv_cache_spec.block_size for g in groups}
    assert blocks == {"H100-80GB": {832}, "A100-80GB": {784}}


def test_the_engine_config_selects_the_kernel() -> None:
    for kernel, expected in (("flashinfer", {(1, 64)}), ("triton", {(0, None)})):
        config = EngineConfig.create(gdn_prefill_kernel=kernel)
        (specs,) = get_kv_cache_specs("Qwen3.5-27B", config=config, use_transformers=False)
        states = {
            (s.num_prefill_checkpoint_blocks, s.prefill_checkpoint_alignment)
            for s in specs.values()
            if isinstance(s, MambaSpec)
        }
        assert states == expected
    with pytest.raises(ConfigError, match="gdn_prefill_kernel"):
        EngineConfig.create(gdn_prefill_kernel="cuda")
