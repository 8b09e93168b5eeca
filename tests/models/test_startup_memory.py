"""vLLM's start-up memory terms (models.startup_memory) and the stored weight formats
they depend on (models.profile_shape)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import plan
from pagedkv.errors import ConfigError, ModelConfigError
from pagedkv.models import describe_model, engine_config_for, load_model_config
from pagedkv.models.profile_shape import profile_shape, weight_format
from pagedkv.models.startup_memory import (
    CUDAGRAPH_BYTES_PER_GRAPH,
    NON_TORCH_BYTES,
    StartupOptions,
    capture_sizes,
    profile_terms,
    reserve_bytes,
)

LLAMA = describe_model("Llama-3.1-8B", use_transformers=False)


@pytest.mark.parametrize(
    ("config", "label", "bits"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8 (block 128x128)", 8.0),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8 (modelopt)", 8.0),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4 (modelopt)", 4.5),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "awq 4-bit g128", 4 + 20 / 128),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True},
         "gptq 4-bit g128", 4.125),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes 4-bit", 4.5),
        (
            {"quant_method": "compressed-tensors",
             "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}},
            "fp8 (compressed-tensors)", 8.0,
        ),
        (
            {"quant_method": "compressed-tensors",
             "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float",
                                                  "group_size": 16}}}},
            "nvfp4 (compressed-tensors)", 4.5,
        ),
        (
            {"quant_method": "compressed-tensors",
             "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int",
                                                  "group_size": 128}}}},
            "int4 g128 (compressed-tensors)", 4.125,
        ),
    ],
)  # fmt: skip
def test_weight_formats(config: dict[str, object], label: str, bits: float) -> None:
    fmt = weight_format(config, "m")
    assert (fmt.label, fmt.dense_bits, fmt.expert_bits) == (label, bits, bits)


def test_an_unknown_format_names_itself() -> None:
    with pytest.raises(ModelConfigError, match=r"quant_method 'hqq'.*--weights"):
        weight_format({"quant_method": "hqq"}, "m")
    with pytest.raises(ModelConfigError, match="compressed-tensors"):
        weight_format({"quant_method": "compressed-tensors"}, "m")


def test_mxfp4_experts_carry_the_kernels_padding() -> None:
    source = load_model_config("gpt-oss-20b")
    shape = profile_shape(describe_model(source, use_transformers=False), source)
    assert shape.weights.expert_padding == (256, 128)
    # hidden 2880 -> 3072, intermediate 2880 -> 2944.
    assert shape.weights.expert_scale(2880, 2880) == pytest.approx(3072 * 2944 / 2880**2)
    assert (shape.num_experts, shape.experts_per_token, shape.vocab_size) == (32, 4, 201088)


def test_a_vision_tower_is_read_and_profiled() -> None:
    source = load_model_config("gemma-4-26B-A4B")
    layout = describe_model(source, use_transformers=False)
    shape = profile_shape(layout, source)
    (vision,) = shape.encoders
    assert vision.kind == "vision" and vision.num_layers == 27 and vision.params > 0
    terms = profile_terms(layout, shape, engine_config_for(layout), StartupOptions())
    assert "vision encoder dummy inputs" in {t.name for t in terms}


def test_terms_sum_to_the_reserve_and_only_the_peak_counts() -> None:
    config = engine_config_for(LLAMA, max_num_seqs=1024, max_num_batched_tokens=8192)
    terms = profile_terms(LLAMA, profile_shape(LLAMA), config, StartupOptions())
    names = [t.name for t in terms]
    assert names == [
        "non-torch (CUDA, NCCL)",
        "forward pass",
        "sampler warm-up",
        "CUDA graph estimate",
    ]
    peaks = [t for t in terms[1:3] if t.counted]
    assert len(peaks) == 1 and peaks[0].bytes == max(t.bytes for t in terms[1:3])
    assert reserve_bytes(terms) == NON_TORCH_BYTES + peaks[0].bytes + terms[-1].bytes
    # 1,024 rows x 128,256 logits x (2 bf16 + 12 float32 bytes), plus the kept hidden states.
    assert terms[2].bytes == 1024 * 128256 * 14 + 8192 * 4096 * 2


def test_capture_sizes_match_vllms_logged_counts() -> None:
    # "PIECEWISE=51 (largest=512), FULL=35 (largest=256)" at max_num_seqs 256.
    assert capture_sizes(256, 8192, blackwell=False) == (51, 35, 512)
    # "PIECEWISE=35 (largest=256), FULL=19 (largest=128)" at max_num_seqs 128.
    assert capture_sizes(128, 8192, blackwell=False) == (35, 19, 256)
    sizes = capture_sizes(1024, 8192, blackwell=True)
    assert sizes.max_capture_tokens == 1024
    # max_num_seqs reaches the largest size: as many full graphs as piecewise ones.
    assert sizes.num_piecewise_graphs == sizes.num_full_graphs == 83


def test_cuda_graphs_per_release_and_flag() -> None:
    config = engine_config_for(LLAMA)
    shape = profile_shape(LLAMA)
    graphs = profile_terms(LLAMA, shape, config, StartupOptions())[-1]
    assert graphs.bytes >= CUDAGRAPH_BYTES_PER_GRAPH
    for options in (StartupOptions(enforce_eager=True), StartupOptions.for_vllm_version("0.19.0")):
        assert profile_terms(LLAMA, shape, config, options)[-1].bytes == 0
    assert StartupOptions.for_vllm_version("v0.10.1.1").sampler == "flashinfer"
    assert StartupOptions.for_vllm_version("0.11.0").sampler == "sort"
    assert StartupOptions.for_vllm_version("0.33.0").sampler == "triton"
    with pytest.raises(ConfigError, match="sampler"):
        StartupOptions(sampler="greedy")


def test_without_flashinfer_releases_before_0_11_warm_the_native_sort_up() -> None:
    """vLLM 0.10 warmed up FlashInfer's sampler where installed and otherwise the
    PyTorch-native top-k/top-p sort (its log: "FlashInfer is not available")."""
    without = StartupOptions(flashinfer_sampler=False)
    assert StartupOptions.for_vllm_version("0.10.1.1", without).sampler == "sort"
    assert StartupOptions.for_vllm_version("0.11.0", without).sampler == "sort"
    assert StartupOptions.for_vllm_version("0.33.0", without).sampler == "triton"
    config = engine_config_for(LLAMA)
    shape = profile_shape(LLAMA)
    reserves = [
        reserve_bytes(
            profile_terms(LLAMA, shape, config, StartupOptions.for_vllm_version("0.10.1", o))
        )
        for o in (StartupOptions(), without)
    ]
    assert reserves[1] > reserves[0]


def test_plan_reads_the_flashinfer_sampler_flag() -> None:
    plans = [
        plan("Llama-3.1-8B", "A100-80GB", vllm_version="0.10.1.1", flashinfer_sampler=f)
        for f in (True, False)
    ]
    assert plans[1].budgets[0].activation_bytes > plans[0].budgets[0].activation_bytes
    assert plans[1].budgets[0].kv_cache_bytes < plans[0].budgets[0].kv_cache_bytes


@settings(max_examples=40, deadline=None)
@given(
    seqs=st.integers(1, 2048),
    tokens=st.integers(256, 32768),
    more_seqs=st.integers(0, 1024),
    more_tokens=st.integers(0, 8192),
)
def test_the_reserve_grows_with_the_step_limits(
    seqs: int, tokens: int, more_seqs: int, more_tokens: int
) -> None:
    """More requests or tokens a step never leave more memory for the KV cache."""
    shape = profile_shape(LLAMA)

    def reserve(s: int, t: int) -> int:
        config = engine_config_for(LLAMA, max_num_seqs=s, max_num_batched_tokens=max(t, s))
        return reserve_bytes(profile_terms(LLAMA, shape, config, StartupOptions()))

    assert reserve(seqs, tokens) <= reserve(seqs + more_seqs, tokens + more_tokens)
