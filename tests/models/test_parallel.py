"""Tensor and pipeline parallel splits of the specs, and impossible splits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError, ModelConfigError
from pagedkv.models import AttentionLayer, describe_model, get_kv_cache_specs, pipeline_stages
from pagedkv.models.layers import attention_spec
from pagedkv.specs import AttentionSpec, FullAttentionSpec, MambaSpec, MLAAttentionSpec


def layout(name: str):  # type: ignore[no-untyped-def]
    return describe_model(name, use_transformers=False)


LLAMA = layout("Llama-3.1-8B")


def test_tp_splits_kv_heads() -> None:
    workers = get_kv_cache_specs(LLAMA, tensor_parallel_size=2)
    assert len(workers) == 2
    for specs in workers:
        spec = specs["model.layers.0.self_attn"]
        assert isinstance(spec, FullAttentionSpec)
        assert spec.num_kv_heads == 4
        assert spec.max_tp_shards == 8
        assert spec.page_size_bytes == 16 * 4 * 256 * 2  # half of the 64 KiB page


def test_tp_beyond_kv_heads_replicates() -> None:
    (spec,) = {
        s
        for s in get_kv_cache_specs(layout("Qwen2.5-7B-Instruct"), tensor_parallel_size=28)[
            5
        ].values()
    }
    assert spec.num_kv_heads == 1
    assert spec.max_tp_shards == 4


def test_tp_not_dividing_heads_names_the_field() -> None:
    with pytest.raises(
        ModelConfigError,
        match=r"Llama-3.1-8B: num_attention_heads .* \(32\) is not divisible by "
        r"tensor_parallel_size \(3\)",
    ):
        get_kv_cache_specs(LLAMA, tensor_parallel_size=3)


def test_tp_not_multiple_of_kv_heads_names_the_field() -> None:
    # phi-4: 40 query heads, 10 KV heads; TP 4 divides the query heads, not the KV heads.
    with pytest.raises(ModelConfigError, match=r"num_key_value_heads .* \(10\) is not divisible"):
        get_kv_cache_specs(layout("phi-4"), tensor_parallel_size=4)
    # Qwen2.5: 28 query heads, 4 KV heads; TP 14 divides the query heads, 14 % 4 != 0.
    with pytest.raises(ModelConfigError, match="multiple of num_key_value_heads"):
        get_kv_cache_specs(layout("Qwen2.5-7B-Instruct"), tensor_parallel_size=14)


def test_mla_is_replicated_over_tp() -> None:
    workers = get_kv_cache_specs(layout("DeepSeek-V3"), tensor_parallel_size=8)
    spec = workers[7]["model.layers.60.self_attn"]
    assert isinstance(spec, MLAAttentionSpec)
    assert (spec.num_kv_heads, spec.head_size, spec.max_tp_shards) == (1, 576, 1)


def test_mamba_state_is_sharded() -> None:
    (one,) = get_kv_cache_specs(layout("Nemotron-H-56B-Base-8K"))
    four = get_kv_cache_specs(layout("Nemotron-H-56B-Base-8K"), tensor_parallel_size=4)[0]
    single, sharded = one["model.layers.0.mixer"], four["model.layers.0.mixer"]
    assert isinstance(single, MambaSpec) and isinstance(sharded, MambaSpec)
    assert sharded.shapes == ((20480 // 4, 3), (256 // 4, 64, 256))
    assert sharded.real_page_size_bytes * 4 == single.real_page_size_bytes


def test_mamba2_single_group_is_replicated_per_rank() -> None:
    (spec,) = set(get_kv_cache_specs(layout("mamba2-2.7b"), tensor_parallel_size=2)[0].values())
    # conv dim = (5120 + 2 x 2 groups x 128) / 2: the one group is copied to each rank.
    assert spec.shapes == ((2560 + 256, 3), (40, 64, 128))


def test_gated_deltanet_heads_not_divisible() -> None:
    with pytest.raises(ModelConfigError, match="linear_num_key_heads"):
        get_kv_cache_specs(layout("Qwen3.5-27B"), tensor_parallel_size=32)


def test_pp_splits_layers_evenly_pp_major() -> None:
    workers = get_kv_cache_specs(LLAMA, tensor_parallel_size=2, pipeline_parallel_size=3)
    assert len(workers) == 6
    sizes = [len(w) for w in workers]
    # 32 layers over 3 stages: the leftovers go to the stages before the last.
    assert sizes == [11, 11, 11, 11, 10, 10]
    assert "model.layers.0.self_attn" in workers[0] and "model.layers.0.self_attn" in workers[1]
    assert "model.layers.31.self_attn" in workers[5]


def test_more_stages_than_layers() -> None:
    with pytest.raises(ModelConfigError, match=r"t5-small: pipeline_parallel_size \(7\) is larger"):
        get_kv_cache_specs(layout("t5-small"), pipeline_parallel_size=7)


def test_encoder_decoder_keeps_self_and_cross_together() -> None:
    workers = get_kv_cache_specs(layout("whisper-large-v3"), pipeline_parallel_size=2)
    for specs in workers:
        selfs = {n.split(".")[3] for n in specs if n.endswith("self_attn")}
        cross = {n.split(".")[3] for n in specs if n.endswith("encoder_attn")}
        assert selfs == cross


def test_config_supplies_options() -> None:
    config = EngineConfig.create(tensor_parallel_size=2, block_size=32, cache_dtype="fp8")
    workers = get_kv_cache_specs(LLAMA, config=config)
    spec = workers[0]["model.layers.0.self_attn"]
    assert (len(workers), spec.block_size, spec.dtype) == (2, 32, "fp8_e4m3")
    with pytest.raises(ConfigError, match="block_size"):
        get_kv_cache_specs(LLAMA, config=config, block_size=64)


def test_mamba_mode_follows_prefix_caching() -> None:
    config = EngineConfig.create(enable_prefix_caching=False)
    (specs,) = get_kv_cache_specs(layout("Jamba-v0.1"), config=config)
    assert {s.mamba_cache_mode for s in specs.values() if isinstance(s, MambaSpec)} == {"none"}
    (specs,) = get_kv_cache_specs(layout("Jamba-v0.1"))
    assert {s.mamba_cache_mode for s in specs.values() if isinstance(s, MambaSpec)} == {"align"}


def test_kv_cache_dtype_applies_to_attention_only() -> None:
    (specs,) = get_kv_cache_specs(layout("Qwen3.5-27B"), kv_cache_dtype="fp8")
    attn = specs["model.layers.3.self_attn"]
    state = specs["model.layers.0.mixer"]
    assert attn.dtype == "fp8_e4m3"
    assert isinstance(state, MambaSpec) and state.dtypes == ("bfloat16", "float32")


NAMES = ["Llama-3.1-8B", "gemma-3-27b-it", "Nemotron-H-56B-Base-8K", "whisper-large-v3", "GLM-5"]
LAYOUTS = {name: layout(name) for name in NAMES}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NAMES), pp=st.integers(1, 12), tp=st.sampled_from([1, 2, 4, 8]))
def test_every_layer_on_exactly_one_stage(name: str, pp: int, tp: int) -> None:
    lay = LAYOUTS[name]
    try:
        workers = get_kv_cache_specs(lay, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    except ModelConfigError as exc:
        assert "\n" not in str(exc) and name in str(exc)
        return
    stages = [workers[i * tp] for i in range(pp)]
    for rank in range(pp):  # tp ranks of one stage hold the same layers
        assert all(workers[rank * tp + r] == stages[rank] for r in range(tp))
    names = [n for stage in stages for n in stage]
    assert names == [layer.name for layer in lay.layers]
    unit_counts = [len(units) for units in pipeline_stages(lay, pp)]
    assert max(unit_counts) - min(unit_counts) <= 1
    assert unit_counts[-1] == min(unit_counts)


@settings(max_examples=200, deadline=None)
@given(
    kv_heads=st.integers(1, 64),
    group=st.integers(1, 8),
    tp=st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32, 64]),
)
def test_kv_heads_are_split_or_replicated(kv_heads: int, group: int, tp: int) -> None:
    layer = AttentionLayer("l", kv_heads * group, kv_heads, 128)
    try:
        spec = attention_spec("m", layer, tp, "bfloat16", 16)
    except ModelConfigError as exc:
        heads_ok = (kv_heads * group) % tp == 0
        kv_ok = kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0
        assert not (heads_ok and kv_ok)
        assert str(exc).startswith("m: ") and "\n" not in str(exc)
        return
    assert isinstance(spec, AttentionSpec)
    assert spec.max_tp_shards == kv_heads
    # Every rank holds its share; ranks beyond the KV heads hold one replicated head.
    assert spec.num_kv_heads * min(tp, kv_heads) == kv_heads
