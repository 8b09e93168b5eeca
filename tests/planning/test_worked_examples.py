"""Reference section 8: vLLM's numbers for its rule (the default), and the better grouping
the least-waste opt-in finds where one exists."""

from __future__ import annotations

import pytest

from pagedkv import EngineConfig, MambaSpec, plan_kv_cache
from pagedkv.planning import KVCachePlan

from .models import GiB, KiB, deepseek_v3, gemma3_27b, group_spec_of, jamba, llama_8b


def vllm_alternative(plan: KVCachePlan):  # type: ignore[no-untyped-def]
    return next(a for a in plan.alternatives if a.name == "vllm")


class TestLlama:
    def test_one_group_two_mib_blocks(self) -> None:
        config = EngineConfig.create(max_model_len=131072)
        plan = plan_kv_cache(config, [llama_8b()], [40 * GiB])
        assert plan.num_groups == 1
        assert plan.groups[0].page_size_bytes == 32 * 64 * KiB
        assert plan.bytes_per_block == 2 * 1024 * KiB == 2_097_152
        assert plan.num_blocks == 20_480 and plan.usable_blocks == 20_479
        point = plan.max_concurrency[0]
        assert point.blocks_per_request == 8192
        assert point.bytes_per_request == 16 * GiB
        assert point.vllm_max_concurrency == 2.5  # vLLM counts the null block
        assert point.max_concurrency == pytest.approx(20_479 / 8192)
        assert point.max_requests == 2
        assert plan.waste_fraction == 0.0

    def test_placement_is_one_layer_major_tensor(self) -> None:
        config = EngineConfig.create(max_model_len=131072)
        (kv,) = plan_kv_cache(config, [llama_8b()], [40 * GiB]).configs
        (tensor,) = kv.kv_cache_tensors
        assert tensor.size == 2 * 1024 * KiB * 20_480
        assert tensor.layer_stride == 64 * KiB * 20_480
        assert tensor.block_stride == 64 * KiB
        assert tensor.offset == 0
        assert len(tensor.layers) == 32

    def test_fp8_and_tp2_variants(self) -> None:
        config = EngineConfig.create(max_model_len=8192)
        fp8 = plan_kv_cache(config, [llama_8b(dtype="fp8")], [8 * GiB])
        assert fp8.bytes_per_block == 1024 * KiB
        tp = EngineConfig.create(max_model_len=8192, tensor_parallel_size=2)
        per_rank = llama_8b(heads=4)
        plan = plan_kv_cache(tp, [per_rank, per_rank], [8 * GiB, 8 * GiB])
        assert plan.bytes_per_block == 1024 * KiB
        assert plan.kv_tp_replicas == 1


class TestGemma:
    config = EngineConfig.create(max_model_len=131072, async_scheduling=True)
    least_waste = config.replace(kv_cache_grouping_rule="least-waste")

    def test_vllm_rule_is_the_default(self) -> None:
        plan = plan_kv_cache(self.config, [gemma3_27b()], [80 * GiB])
        assert (plan.num_groups, plan.bytes_per_block) == (7, 1_310_720)
        assert plan.max_concurrency[0].bytes_per_request == 14_726 * 1_310_720
        assert plan.waste_fraction == pytest.approx(0.0592, abs=1e-3)
        assert plan.alternatives == ()

    def test_vllm_rule_numbers(self) -> None:
        plan = plan_kv_cache(self.least_waste, [gemma3_27b()], [80 * GiB])
        vllm = vllm_alternative(plan)
        assert vllm.num_groups == 7
        assert vllm.layers_per_group == 10
        assert vllm.bytes_per_block == 1_310_720
        assert vllm.bytes_per_request == 14_726 * 1_310_720  # ~17.98 GiB
        assert round(vllm.bytes_per_request / GiB, 2) == 17.98

    def test_vllm_group_sizes_by_stride(self) -> None:
        from pagedkv.planning.grouping import groups_from_buckets, make_buckets

        buckets = make_buckets(gemma3_27b())
        groups = groups_from_buckets(buckets, 10)
        assert [len(g.layer_names) for g in groups] == [9, 9, 9, 9, 8, 8, 10]
        assert groups[0].layer_names[:3] == ("layers.0", "layers.7", "layers.14")

    def test_default_budget_keeps_most_of_the_gain(self) -> None:
        # 16 groups at most: 5 layers per group pads 3 sliding slots (52 = 11 x 5 - 3).
        plan = plan_kv_cache(self.least_waste, [gemma3_27b()], [80 * GiB])
        chosen = next(a for a in plan.alternatives if a.chosen)
        assert (plan.num_groups, chosen.layers_per_group, chosen.max_groups) == (13, 5, 16)
        assert plan.bytes_per_block == 5 * 128 * KiB
        point = plan.max_concurrency[0]
        assert point.blocks_per_request == 2 * 8192 + 11 * 1089
        assert round(point.bytes_per_request / GiB, 2) == 17.31
        assert plan.waste_fraction == pytest.approx(0.0230, abs=1e-4)
        excluded = [a for a in plan.alternatives if not a.within_budget]
        assert [(a.num_groups, a.waste_fraction) for a in excluded] == [(31, 0.0)]
        assert "over the 16-group budget" in excluded[0].name

    def test_search_finds_zero_waste_grouping(self) -> None:
        config = self.least_waste.replace(max_kv_cache_groups=64)
        plan = plan_kv_cache(config, [gemma3_27b()], [80 * GiB])
        assert vllm_alternative(plan).waste_fraction == pytest.approx(0.0592, abs=1e-3)
        chosen = next(a for a in plan.alternatives if a.chosen)
        assert chosen.name != "vllm"
        assert plan.waste_fraction == 0.0
        assert plan.num_groups == 31  # gcd(52, 10) = 2 layers per group
        assert plan.bytes_per_block == 2 * 128 * KiB
        point = plan.max_concurrency[0]
        assert point.blocks_per_request == 5 * 8192 + 26 * 1089
        assert point.bytes_per_request < vllm_alternative(plan).bytes_per_request
        assert all(g.waste_bytes == 0 for g in plan.groups)

    def test_vllm_per_group_waste(self) -> None:
        # vLLM: 9-layer sliding groups waste 10 % of a block, 8-layer ones 20 %.
        from pagedkv.planning.grouping import groups_from_buckets, make_buckets

        groups = groups_from_buckets(make_buckets(gemma3_27b()), 10)
        widths = [sum(s.page_size_bytes for s in g.layer_specs().values()) for g in groups]
        assert [1 - w / 1_310_720 for w in widths] == pytest.approx(
            [0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.0]
        )


class TestJamba:
    config = EngineConfig.create(max_model_len=262_144)

    def test_attention_block_raised_to_hold_a_state(self) -> None:
        plan = plan_kv_cache(self.config, [jamba()], [80 * GiB])
        assert plan.block_size == 80
        assert plan.bytes_per_block == 1_310_720
        assert plan.num_groups == 8
        mamba = [g for g in plan.groups if g.kind == "mamba"]
        attention = [g for g in plan.groups if g.kind == "full_attention"]
        assert len(mamba) == 7 and len(attention) == 1
        assert all(g.num_layers == 4 for g in plan.groups)
        assert all(g.padding_bytes == 4 * 16_384 for g in mamba)
        spec = plan.groups[0].layer_names[0]
        (kv,) = plan.configs
        group_spec = group_spec_of(kv, spec)
        assert isinstance(group_spec, MambaSpec)
        assert group_spec.page_size_bytes == 327_680
        assert group_spec.real_page_size_bytes == 311_296
        assert group_spec.block_size == 80

    def test_request_blocks(self) -> None:
        plan = plan_kv_cache(self.config, [jamba()], [80 * GiB])
        assert plan.max_concurrency[0].blocks_per_request == 3277 + 14
        none_mode = plan_kv_cache(self.config, [jamba(mode="none")], [80 * GiB])
        assert none_mode.max_concurrency[0].blocks_per_request == 3277 + 7

    def test_vllm_rule_already_optimal_and_kept(self) -> None:
        config = self.config.replace(kv_cache_grouping_rule="least-waste")
        plan = plan_kv_cache(config, [jamba()], [80 * GiB])
        assert plan.groups == plan_kv_cache(self.config, [jamba()], [80 * GiB]).groups
        chosen = next(a for a in plan.alternatives if a.chosen)
        assert chosen.name == "vllm"
        assert all(a.bytes_per_request >= chosen.bytes_per_request for a in plan.alternatives)

    def test_fp32_ssm_state(self) -> None:
        specs = {
            name: MambaSpec(
                block_size=16,
                shapes=((8192, 3), (8192, 16)),
                dtypes=("bfloat16", "float32"),
                mamba_cache_mode="align",
            )
            if isinstance(spec, MambaSpec)
            else spec
            for name, spec in jamba().items()
        }
        plan = plan_kv_cache(self.config, [specs], [80 * GiB])
        assert plan.block_size == 144
        assert plan.groups[0].page_size_bytes == 4 * 589_824
        assert plan.groups[0].padding_bytes == 4 * 16_384


class TestDeepSeekMLA:
    def test_one_group_and_tp_replicas(self) -> None:
        config = EngineConfig.create(max_model_len=163_840, tensor_parallel_size=8)
        specs = deepseek_v3()
        plan = plan_kv_cache(config, [specs] * 8, [40 * GiB] * 8)
        assert plan.num_groups == 1
        assert plan.groups[0].page_size_bytes == 61 * 73_728
        assert plan.bytes_per_block == 4_497_408
        assert plan.kv_tp_replicas == 8
        assert all(c.kv_tp_replicas == 8 for c in plan.configs)

    def test_fp8_ds_mla_page(self) -> None:
        from pagedkv import MLAAttentionSpec

        spec = MLAAttentionSpec(block_size=64, head_size=576, state_content_bytes=656)
        config = EngineConfig.create(max_model_len=8192)
        plan = plan_kv_cache(config, [{"layers.0": spec}], [1 * GiB])
        assert plan.groups[0].page_size_bytes == 41_984


def test_layer_slot_i_is_shared_by_layer_i_of_every_group() -> None:
    config = EngineConfig.create(
        max_model_len=131072,
        async_scheduling=True,
        kv_cache_grouping_rule="least-waste",
        max_kv_cache_groups=31,
    )
    plan = plan_kv_cache(config, [gemma3_27b()], [80 * GiB])
    (kv,) = plan.configs
    n = kv.num_blocks
    regions = kv.layer_regions()
    assert len(kv.kv_cache_tensors) == plan.num_groups == 31
    assert {t.size for t in kv.kv_cache_tensors} == {plan.bytes_per_block * n}
    for slot in range(2):
        offsets = {regions[g.layer_names[slot]].offset for g in kv.kv_cache_groups}
        assert offsets == {slot * 128 * KiB * n}
    assert {r.block_stride for r in regions.values()} == {128 * KiB}
