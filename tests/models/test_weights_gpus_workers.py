"""Parameter counts and weight bytes, the GPU table, engine configs and memory budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.models import (
    activation_reserve_bytes,
    describe_model,
    engine_config_for,
    estimate_weight_bytes,
    get_gpu,
    list_gpus,
    memory_budgets,
    weight_bytes_per_worker,
)
from pagedkv.models.workers import startup_terms

# Published total parameter counts (billions), language model only.
PUBLISHED_PARAMS = {
    "Llama-3.1-8B": 8.03,
    "Mistral-7B-v0.1": 7.24,
    "Mixtral-8x7B-v0.1": 46.7,
    "Qwen2.5-7B-Instruct": 7.62,
    "Qwen3-8B": 8.19,
    "phi-4": 14.7,
    "Phi-3-mini-4k-instruct": 3.82,
    "gemma-2-9b-it": 9.24,
    "gemma-3-27b-it": 27.0,
    "DeepSeek-V3": 671,
    "DeepSeek-V2-Lite": 15.7,
    "Kimi-K2-Instruct": 1040,
    "GLM-5": 744,
    "gpt-oss-20b": 20.9,
    "Jamba-v0.1": 52,
    "Qwen3-Next-80B-A3B-Instruct": 80,
    "mamba2-2.7b": 2.7,
    "granite-4.0-h-350m": 0.34,
    "t5-small": 0.0605,
    "bart-large": 0.406,
    "whisper-large-v3": 1.55,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_count_near_published(name: str) -> None:
    layout = describe_model(name, use_transformers=False)
    assert layout.num_params / 1e9 == pytest.approx(PUBLISHED_PARAMS[name], rel=0.03)


def test_weight_bytes_use_dtype_and_quantisation() -> None:
    llama = describe_model("Llama-3.1-8B", use_transformers=False)
    assert estimate_weight_bytes(llama) == llama.num_params * 2
    # DeepSeek-V3 ships fp8 weights (bf16 embeddings): about 1 byte per parameter.
    deepseek = describe_model("DeepSeek-V3", use_transformers=False)
    assert estimate_weight_bytes(deepseek) / deepseek.num_params == pytest.approx(1.0, abs=0.01)
    # gpt-oss: mxfp4 experts (4.25 bits), the rest bf16: ~12.8 GiB.
    assert estimate_weight_bytes("gpt-oss-20b") / 2**30 == pytest.approx(12.8, abs=0.2)


def test_weights_split_over_workers() -> None:
    llama = describe_model("Llama-3.1-8B", use_transformers=False)
    per_worker = weight_bytes_per_worker(llama, 2, 2)
    assert len(per_worker) == 4
    assert sum(per_worker) == pytest.approx(llama.num_params * 2, rel=1e-6)
    assert per_worker[0] == per_worker[1]
    assert estimate_weight_bytes(llama, 2, 2) == max(per_worker)


def test_gpu_table() -> None:
    names = [g.name for g in list_gpus()]
    assert "H100-80GB" in names and len(names) == len(set(names)) >= 10
    h100 = get_gpu("h100-80gb")
    assert h100.memory_bytes == 80 * 10**9
    # The total CUDA reports, as vLLM start-up logs print it, with its source.
    assert h100.planning_memory_bytes == int(79.19 * 2**30)
    assert h100.planning_memory_source == "as CUDA reports it" and h100.usable_memory_source
    assert get_gpu("B200").planning_memory_bytes == 180 * 2**30  # HBM stacks are binary-sized
    assert get_gpu("L4").planning_memory_bytes == 24 * 10**9  # GDDR: the decimal figure
    assert get_gpu("H100 SXM5") is h100  # an alias
    a100 = get_gpu("A100-40GB")
    assert a100.planning_memory_bytes == int(39.38 * 2**30)
    with pytest.raises(ConfigError, match="ambiguous"):
        get_gpu("A100")
    with pytest.raises(ConfigError, match="not in the GPU table"):
        get_gpu("V100")


def test_engine_config_for() -> None:
    config = engine_config_for("Llama-3.1-8B", tensor_parallel_size=2)
    assert (config.model.name, config.max_model_len, config.model.dtype) == (
        "Llama-3.1-8B",
        131072,
        "bfloat16",
    )
    assert config.parallel.tensor_parallel_size == 2
    whisper = engine_config_for("whisper-large-v3")
    assert whisper.max_num_encoder_input_tokens == 1500
    assert whisper.cache.enable_prefix_caching is False
    assert engine_config_for("mamba2-2.7b").max_model_len == 8192  # no limit in the config
    assert engine_config_for("t5-small", max_model_len=128).max_model_len == 128


def test_memory_budget_terms_add_up() -> None:
    layout = describe_model("Llama-3.1-8B", use_transformers=False)
    config = engine_config_for(layout, gpu_memory_utilization=0.9)
    (budget,) = memory_budgets(layout, config, device_bytes=80 * 10**9)
    assert budget.usable_bytes == 72 * 10**9
    assert budget.weight_bytes == estimate_weight_bytes(layout)
    assert budget.activation_bytes == activation_reserve_bytes(layout, config)
    assert budget.kv_cache_bytes == (
        budget.usable_bytes - budget.weight_bytes - budget.activation_bytes
    )
    (given,) = memory_budgets(layout, config, kv_cache_bytes=10**9)
    assert given.kv_cache_bytes == 10**9 and given.given
    with pytest.raises(ConfigError, match="device memory"):
        memory_budgets(layout, config)


def test_tp_shards_the_forward_pass_and_adds_nccl_memory() -> None:
    layout = describe_model("Llama-3.1-8B", use_transformers=False)
    one = {t.name: t for t in startup_terms(layout, engine_config_for(layout))}
    two = {
        t.name: t for t in startup_terms(layout, engine_config_for(layout, tensor_parallel_size=2))
    }
    assert two["forward pass"].bytes < one["forward pass"].bytes
    # The sampler works on the gathered, full-vocabulary logits on every rank.
    assert two["sampler warm-up"].bytes > one["sampler warm-up"].bytes
    assert two["non-torch (CUDA, NCCL)"].bytes > one["non-torch (CUDA, NCCL)"].bytes


def test_glm45_air_moe_from_its_published_numbers(tmp_path: Path) -> None:
    config = {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "hidden_size": 4096,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 46,
        "vocab_size": 151552,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    layout = describe_model(path, use_transformers=False)
    assert layout.num_params / 1e9 == pytest.approx(106, rel=0.03)  # "106B total"
    assert layout.layer_kinds() == {"full_attention": 46}
    assert layout.units[0].expert_params == 0 and layout.units[1].expert_params > 0


WEIGHT_MODELS = ["Llama-3.1-8B", "DeepSeek-V3", "gpt-oss-20b", "Jamba-v0.1", "whisper-large-v3"]
WEIGHT_LAYOUTS = {name: describe_model(name, use_transformers=False) for name in WEIGHT_MODELS}


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(WEIGHT_MODELS),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.integers(1, 8),
)
def test_weights_are_conserved_across_workers(name: str, tp: int, pp: int) -> None:
    layout = WEIGHT_LAYOUTS[name]
    per_worker = weight_bytes_per_worker(layout, tp, pp)
    total = weight_bytes_per_worker(layout, 1, 1)[0]
    assert len(per_worker) == tp * pp
    # Each stage is split evenly over its TP ranks (rounded up per rank).
    assert total <= sum(per_worker) <= total + tp * pp
    stages = [per_worker[i * tp] for i in range(pp)]
    assert all(per_worker[i * tp + r] == stages[i] for i in range(pp) for r in range(tp))
