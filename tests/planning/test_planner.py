"""Cross-worker planning: PP/TP, host-resident groups, hybrid off, capacity and the report."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from pagedkv import (
    ChunkedLocalAttentionSpec,
    ConfigError,
    EncoderOnlyAttentionSpec,
    EngineConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    PlanningError,
    RegistryError,
    get_kv_cache_configs,
    plan_kv_cache,
)
from pagedkv.config import ModelConfig
from pagedkv.platforms import GenericPlatform, set_current_platform

from .models import GiB, full, jamba, llama_8b, mamba1, sliding

CONFIG = EngineConfig.create(max_model_len=4096)


class TestPipelineParallel:
    def stages(self) -> list[dict[str, KVCacheSpec]]:
        return [
            {"full.0": full(), "sw.0": sliding(128), "sw.1": sliding(128)},
            {"full.1": full(), "sw.2": sliding(128), "sw.3": sliding(128)},
        ]

    def test_groups_balanced_across_stages(self) -> None:
        config = CONFIG.replace(pipeline_parallel_size=2)
        plan = plan_kv_cache(config, self.stages(), [GiB, GiB])
        assert [g.layer_names for g in plan.groups] == [
            ("full.0", "full.1"),
            ("sw.0", "sw.2"),
            ("sw.1", "sw.3"),
        ]
        stage0, stage1 = plan.configs
        assert [g.layer_names for g in stage0.kv_cache_groups] == [
            ("full.0",),
            ("sw.0",),
            ("sw.1",),
        ]
        assert [g.layer_names for g in stage1.kv_cache_groups] == [
            ("full.1",),
            ("sw.2",),
            ("sw.3",),
        ]
        assert stage0.num_blocks == stage1.num_blocks

    def test_stage_with_less_memory_bounds_every_stage(self) -> None:
        configs = get_kv_cache_configs(CONFIG, self.stages(), [GiB, GiB // 4])
        assert {c.num_blocks for c in configs} == {(GiB // 4) // 65536}

    def test_stage_without_layers(self) -> None:
        specs = [llama_8b(num_layers=2), {}]
        configs = get_kv_cache_configs(CONFIG, specs, [GiB, 0])
        assert configs[0].num_blocks == configs[1].num_blocks == GiB // (2 * 65536)
        assert configs[1].kv_cache_tensors == ()
        assert [g.layer_names for g in configs[1].kv_cache_groups] == [()]


class TestTensorParallel:
    def test_mla_replicated_on_every_rank(self) -> None:
        from pagedkv import MLAAttentionSpec

        config = CONFIG.replace(tensor_parallel_size=4)
        specs = {"m": MLAAttentionSpec(block_size=64, head_size=576)}
        configs = get_kv_cache_configs(config, [specs] * 4, [GiB] * 4)
        assert {c.kv_tp_replicas for c in configs} == {4}

    def test_fewer_kv_heads_than_ranks(self) -> None:
        config = CONFIG.replace(tensor_parallel_size=8)
        specs = {"a": full(heads=1, max_tp_shards=2)}
        (kv, *_) = get_kv_cache_configs(config, [specs] * 8, [GiB] * 8)
        assert kv.kv_tp_replicas == 4

    def test_split_heads_are_not_replicas(self) -> None:
        config = CONFIG.replace(tensor_parallel_size=2)
        configs = get_kv_cache_configs(config, [llama_8b(heads=4)] * 2, [GiB] * 2)
        assert {c.kv_tp_replicas for c in configs} == {1}


class HostGrouping:
    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        names = list(kv_cache_spec)
        return [
            KVCacheGroupSpec(layer_names=tuple(names[:2]), kv_cache_spec=full()),
            KVCacheGroupSpec(
                layer_names=tuple(names[2:]), kv_cache_spec=full(), host_resident=True
            ),
        ]


def test_host_resident_tensors_sized_apart() -> None:
    config = CONFIG.replace(model=ModelConfig(max_model_len=4096, kv_cache_grouping=HostGrouping()))
    plan = plan_kv_cache(config, [llama_8b(num_layers=5)], [GiB])
    assert plan.num_blocks == GiB // (2 * 65536)  # only the device group counts
    (kv,) = plan.configs
    assert kv.device_bytes == GiB
    (host,) = {t.size for t in kv.host_tensors}
    assert host == 3 * 65536 * plan.num_blocks
    assert kv.layer_regions()["layers.4"].host_resident
    assert plan.workers[0].host_bytes == host
    assert plan.max_concurrency[0].blocks_per_request == 4096 // 16  # host group not counted


class TestHybridDisabled:
    def test_sliding_promoted_to_full(self) -> None:
        config = CONFIG.replace(enable_hybrid_kv_cache=False)
        specs = {"s0": sliding(128), "s1": sliding(128), "f0": full()}
        plan = plan_kv_cache(config, [specs], [GiB])
        assert plan.num_groups == 1 and plan.groups[0].kind == "full_attention"
        (kv,) = plan.configs
        assert kv.kv_cache_groups[0].kv_cache_spec.sliding_window == 128  # type: ignore[attr-defined]

    def test_platform_without_hybrid_support(self) -> None:
        class NoHybrid(GenericPlatform):
            @classmethod
            def support_hybrid_kv_cache(cls) -> bool:
                return False

        set_current_platform(NoHybrid)
        plan = plan_kv_cache(CONFIG, [{"s": sliding(128), "f": full()}], [GiB])
        assert plan.num_groups == 1

    def test_mamba_cannot_be_promoted(self) -> None:
        config = CONFIG.replace(enable_hybrid_kv_cache=False)
        with pytest.raises(PlanningError, match="hybrid KV cache groups are disabled"):
            plan_kv_cache(config, [jamba()], [8 * GiB])


class TestCapacity:
    def test_full_grows_local_bounded_state_constant(self) -> None:
        lengths = [4096, 65536, 1 << 20]
        config = CONFIG.replace(max_model_len=1 << 20)
        blocks = {
            name: [
                p.blocks_per_request
                for p in plan_kv_cache(
                    config, [specs], [64 * GiB], context_lengths=lengths
                ).max_concurrency
            ]
            for name, specs in {
                "full": {"a": full()},
                "sliding": {"a": sliding(1024)},
                "chunked": {
                    "a": ChunkedLocalAttentionSpec(
                        block_size=16, num_kv_heads=8, head_size=128, attention_chunk_size=8192
                    )
                },
                "mamba": {"a": mamba1(mode="none")},
            }.items()
        }
        # Points are max_model_len first, then the other lengths in order.
        assert blocks["full"] == [65536, 256, 4096]
        assert blocks["sliding"][0] == blocks["sliding"][2] < 1000
        assert blocks["chunked"][0] == blocks["chunked"][2] == (8192 + 8192) // 16
        assert blocks["mamba"] == [1, 1, 1]

    def test_context_lengths_and_token_capacity(self) -> None:
        plan = plan_kv_cache(CONFIG, [llama_8b()], [2 * GiB], context_lengths=[1024, 4096, 1024])
        assert [p.context_len for p in plan.max_concurrency] == [4096, 1024]
        short = plan.concurrency_at(1024)
        assert short.blocks_per_request == 64
        assert short.max_requests == (plan.num_blocks - 1) // 64
        assert plan.token_capacity == (plan.num_blocks - 1) * 16
        assert plan.full_attention_token_capacity == (plan.num_blocks - 1) * 16

    def test_bad_context_length(self) -> None:
        with pytest.raises(PlanningError, match="context_lengths"):
            plan_kv_cache(CONFIG, [llama_8b()], [2 * GiB], context_lengths=[0])

    def test_to_dict_is_json(self) -> None:
        plan = plan_kv_cache(
            CONFIG.replace(max_model_len=-1), [jamba()], [8 * GiB], context_lengths=[512]
        )
        data = json.loads(json.dumps(plan.to_dict()))
        for key in (
            "block_size",
            "num_blocks",
            "bytes_per_block",
            "groups",
            "max_model_len",
            "max_concurrency",
            "token_capacity",
            "waste_fraction",
            "alternatives",
        ):
            assert key in data
        assert data["groups"][0]["kind"] == "mamba"
        assert {"layer_names", "block_size", "page_size_bytes", "waste_bytes"} <= set(
            data["groups"][0]
        )
        assert data["max_model_len"] == plan.max_model_len > 0


class TestSingleGroupAlternative:
    @pytest.mark.parametrize(
        "specs",
        [
            llama_8b(4),
            # Equal kind, unequal pages: one uniform-type group.
            {"a": full(heads=8), "b": full(heads=4), "c": full(heads=8, page_size_padded=70000)},
        ],
        ids=["plain", "uniform_type"],
    )
    @pytest.mark.parametrize("max_groups", [None, 3])
    def test_matches_the_plan(self, specs: dict[str, KVCacheSpec], max_groups: int | None) -> None:
        config = CONFIG.replace(
            kv_cache_grouping_rule="least-waste", max_kv_cache_groups=max_groups
        )
        assert plan_kv_cache(CONFIG, [specs], [GiB]).alternatives == ()  # vLLM's: none
        plan = plan_kv_cache(config, [specs], [GiB])
        (alt,) = plan.alternatives
        (group,) = plan.groups
        assert alt.name == "single group" and alt.chosen and alt.within_budget
        assert alt.max_groups == (16 if max_groups is None else max_groups)
        assert (alt.num_groups, alt.layers_per_group) == (1, len(specs))
        assert alt.block_sizes == (plan.block_size,)
        assert alt.bytes_per_block == plan.bytes_per_block == group.page_size_bytes
        assert alt.bytes_per_request == plan.max_concurrency[0].bytes_per_request
        assert alt.waste_fraction == pytest.approx(group.waste_fraction)
        assert alt.reference_len == plan.max_model_len


class TestInputs:
    def test_worker_count_mismatch(self) -> None:
        with pytest.raises(PlanningError, match="2 workers but available_memory_per_worker has 1"):
            get_kv_cache_configs(CONFIG, [{}, {}], [GiB])

    def test_no_workers(self) -> None:
        with pytest.raises(PlanningError, match="at least one worker"):
            get_kv_cache_configs(CONFIG, [], [])

    def test_memory_not_an_integer(self) -> None:
        with pytest.raises(PlanningError, match=r"available_memory_per_worker\[0\]"):
            get_kv_cache_configs(CONFIG, [{}], [1.5])  # type: ignore[list-item]

    def test_unregistered_spec_named(self) -> None:
        spec = EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=1, head_size=64)
        with pytest.raises(RegistryError, match="'enc'"):
            get_kv_cache_configs(CONFIG, [{"enc": spec}], [GiB])

    def test_layout_from_config_and_bad_layout(self) -> None:
        (kv,) = get_kv_cache_configs(CONFIG.replace(kv_cache_layout="hnd"), [llama_8b(2)], [GiB])
        assert kv.kv_cache_layout == "HND"
        with pytest.raises(ConfigError, match="kv_cache_layout"):
            get_kv_cache_configs(CONFIG.replace(kv_cache_layout="LBXYZ"), [llama_8b(2)], [GiB])
