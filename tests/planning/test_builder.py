"""Builder selection through the platform, custom builders, and the planner's checks on them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import pytest

from pagedkv import (
    EngineConfig,
    InsufficientMemoryError,
    KVCacheConfig,
    KVCacheConfigBuilder,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    PlanningError,
    Platform,
    PlatformError,
    get_kv_cache_config_builder,
    get_kv_cache_configs,
    plan_kv_cache,
)
from pagedkv.config import ModelConfig
from pagedkv.planning import DefaultKVCacheConfigBuilder, SupportsKVCacheGrouping
from pagedkv.platforms import PLATFORM_ENV, qualname_of, set_current_platform

from .models import GiB, full, gemma3_27b, llama_8b, sliding

CONFIG = EngineConfig.create(max_model_len=4096)


class OnePerLayerBlockOuterBuilder(KVCacheConfigBuilder):
    """Every layer its own group; block ``b`` is bytes [b * bpb, (b + 1) * bpb), every
    group's layer at offset 0 inside it (aliasing at equal block ids only)."""

    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        return [
            KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=spec)
            for name, spec in kv_cache_spec.items()
        ]

    def get_kv_cache_config_from_groups(
        self, config: EngineConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        live = [g for g in kv_cache_groups if g.layer_names]
        bpb = max((g.kv_cache_spec.page_size_bytes for g in live), default=0)
        tensors = [
            KVCacheTensor(
                size=bpb * num_blocks,
                layers=g.layer_names,
                layer_stride=0,
                block_stride=bpb,
                page_size_bytes=g.kv_cache_spec.page_size_bytes,
            )
            for g in live
        ]
        return KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=kv_cache_groups
        )


class CustomPlatform(Platform):
    name = "custom-test"
    builder: type[KVCacheConfigBuilder] = OnePerLayerBlockOuterBuilder

    @classmethod
    def get_kv_cache_config_builder_cls(cls, config: EngineConfig | None) -> str:
        return qualname_of(cls.builder)


def use_builder(builder: type[KVCacheConfigBuilder]) -> None:
    platform = type("P", (CustomPlatform,), {"builder": builder})
    set_current_platform(platform)


def test_default_builder_is_the_platform_default() -> None:
    builder = get_kv_cache_config_builder(CONFIG)
    assert type(builder) is DefaultKVCacheConfigBuilder
    assert get_kv_cache_config_builder(CONFIG) is not builder  # fresh every call


def test_custom_builder_replaces_grouping_and_placement() -> None:
    set_current_platform(CustomPlatform)
    assert isinstance(get_kv_cache_config_builder(CONFIG), OnePerLayerBlockOuterBuilder)
    specs = gemma3_27b()
    plan = plan_kv_cache(CONFIG, [specs], [8 * GiB])
    assert plan.num_groups == 62
    assert plan.alternatives == ()
    (kv,) = plan.configs
    regions = kv.layer_regions()
    assert {r.offset for r in regions.values()} == {0}
    assert {r.block_stride for r in regions.values()} == {128 * 1024}
    assert plan.num_blocks == 8 * GiB // (128 * 1024)


def test_custom_builder_through_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLATFORM_ENV, qualname_of(CustomPlatform))
    set_current_platform(None)
    (kv,) = get_kv_cache_configs(CONFIG, [llama_8b(num_layers=3)], [GiB])
    assert len(kv.kv_cache_groups) == 3


def test_model_declared_builder_qualname() -> None:
    config = CONFIG.replace(
        model=ModelConfig(
            max_model_len=4096, kv_cache_config_builder=qualname_of(OnePerLayerBlockOuterBuilder)
        )
    )
    assert isinstance(get_kv_cache_config_builder(config), OnePerLayerBlockOuterBuilder)


def test_builder_that_is_not_a_builder() -> None:
    config = CONFIG.replace(
        model=ModelConfig(max_model_len=4096, kv_cache_config_builder="pagedkv.config.ModelConfig")
    )
    with pytest.raises(PlatformError, match="not a KVCacheConfigBuilder subclass"):
        get_kv_cache_config_builder(config)


class DropsLayer(OnePerLayerBlockOuterBuilder):
    def get_kv_cache_groups(self, config, kv_cache_spec):  # type: ignore[no-untyped-def]
        return super().get_kv_cache_groups(config, kv_cache_spec)[1:]


class DuplicatesLayer(OnePerLayerBlockOuterBuilder):
    def get_kv_cache_groups(self, config, kv_cache_spec):  # type: ignore[no-untyped-def]
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return [*groups, groups[0]]


class WrongBlockCount(OnePerLayerBlockOuterBuilder):
    def get_kv_cache_config_from_groups(self, config, kv_cache_groups, num_blocks):  # type: ignore[no-untyped-def]
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks + 1)


class Oversized(OnePerLayerBlockOuterBuilder):
    def _get_pool_bytes_per_block(self, config, kv_cache_groups):  # type: ignore[no-untyped-def]
        return 32 * 1024  # claims half of what it places


class SharedSlotOneGroup(DefaultKVCacheConfigBuilder):
    """Puts every layer of one group on the same bytes: a real overlap."""

    def get_kv_cache_config_from_groups(self, config, kv_cache_groups, num_blocks):  # type: ignore[no-untyped-def]
        kv = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        (tensor,) = kv.kv_cache_tensors
        bad = KVCacheTensor(
            size=tensor.size,
            layers=tensor.layers,
            layer_stride=0,
            block_stride=tensor.block_stride,
            page_size_bytes=tensor.page_size_bytes,
        )
        return KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=(bad,), kv_cache_groups=kv.kv_cache_groups
        )


class ShiftedAlias(OnePerLayerBlockOuterBuilder):
    """Two groups sharing bytes at different block ids (offset shifted by half a page)."""

    def _get_pool_bytes_per_block(self, config, kv_cache_groups):  # type: ignore[no-untyped-def]
        return 2 * 65536

    def get_kv_cache_config_from_groups(self, config, kv_cache_groups, num_blocks):  # type: ignore[no-untyped-def]
        kv = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        first, second, *rest = kv.kv_cache_tensors
        size = first.size + first.block_stride

        def at(t: KVCacheTensor, offset: int) -> KVCacheTensor:
            return KVCacheTensor(
                size=size,
                layers=t.layers,
                layer_stride=0,
                block_stride=t.block_stride,
                page_size_bytes=t.page_size_bytes,
                offset=offset,
            )

        tensors = (at(first, 0), at(second, first.block_stride // 2), *(at(t, 0) for t in rest))
        return KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=kv.kv_cache_groups
        )


class TwoAllocations(OnePerLayerBlockOuterBuilder):
    def get_kv_cache_config_from_groups(self, config, kv_cache_groups, num_blocks):  # type: ignore[no-untyped-def]
        kv = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        first, *rest = kv.kv_cache_tensors
        bigger = KVCacheTensor(
            size=first.size + 1,
            layers=first.layers,
            layer_stride=0,
            block_stride=first.block_stride,
            page_size_bytes=first.page_size_bytes,
        )
        return KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=(bigger, *rest),
            kv_cache_groups=kv.kv_cache_groups,
        )


@pytest.mark.parametrize(
    ("builder", "error", "match"),
    [
        (DropsLayer, PlanningError, r"layers in no group: 'layers\.0'"),
        (DuplicatesLayer, PlanningError, r"more than one group: 'layers\.0'"),
        (WrongBlockCount, PlanningError, "asked for"),
        (Oversized, InsufficientMemoryError, "placed"),
        (SharedSlotOneGroup, PlanningError, "inside one group"),
        (ShiftedAlias, PlanningError, "at different block ids"),
        (TwoAllocations, PlanningError, "share one"),
    ],
)
def test_planner_enforces_invariants_on_custom_builders(
    builder: type[KVCacheConfigBuilder], error: type[Exception], match: str
) -> None:
    use_builder(builder)
    with pytest.raises(error, match=match):
        get_kv_cache_configs(CONFIG, [llama_8b(num_layers=3)], [GiB])


def test_tp_ranks_share_one_placement_but_each_is_held_to_its_memory() -> None:
    # Two pipeline stages of two TP ranks: one placement per stage.
    stages = [{f"layers.{i}": full()} for i in range(2)]
    configs = get_kv_cache_configs(CONFIG, [s for s in stages for _ in range(2)], [GiB] * 4)
    assert configs[0] is configs[1] and configs[2] is configs[3]
    assert configs[0].layer_names == ["layers.0"] and configs[2].layer_names == ["layers.1"]
    # Oversized places twice what it claims: 4 GiB on rank 0 holds that, 1 GiB on rank 1 not.
    use_builder(Oversized)
    with pytest.raises(InsufficientMemoryError, match="on worker 1, which has"):
        get_kv_cache_configs(CONFIG, [llama_8b(num_layers=1)] * 2, [4 * GiB, GiB])


class FullOnlyGrouping:
    """A model that keeps sliding layers in one group and full layers in another."""

    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        by_kind: dict[str, list[str]] = {}
        for name, spec in kv_cache_spec.items():
            by_kind.setdefault(spec.kind, []).append(name)
        return [
            KVCacheGroupSpec(layer_names=tuple(n), kv_cache_spec=kv_cache_spec[n[0]])
            for n in by_kind.values()
        ]


def test_model_declared_grouping() -> None:
    grouping = FullOnlyGrouping()
    assert isinstance(grouping, SupportsKVCacheGrouping)
    config = CONFIG.replace(model=ModelConfig(max_model_len=4096, kv_cache_grouping=grouping))
    specs = {"s0": sliding(128), "s1": sliding(128), "s2": sliding(128), "f0": full()}
    plan = plan_kv_cache(config, [specs], [GiB])
    assert [g.num_layers for g in plan.groups] == [3, 1]
    assert plan.bytes_per_block == 3 * 65536
    assert plan.groups[1].unused_slot_bytes == 2 * 65536


def test_model_grouping_with_unequal_pages_uses_block_outer_placement() -> None:
    grouping = FullOnlyGrouping()
    config = CONFIG.replace(model=ModelConfig(max_model_len=4096, kv_cache_grouping=grouping))
    specs = {"s0": sliding(128, heads=4), "f0": full(), "f1": full()}
    (kv,) = get_kv_cache_configs(config, [specs], [GiB])
    regions = kv.layer_regions()
    assert {r.block_stride for r in regions.values()} == {2 * 65536}
    assert regions["f1"].offset == 65536 and regions["s0"].offset == 0


def test_bad_model_grouping_object() -> None:
    config = CONFIG.replace(model=ModelConfig(max_model_len=4096, kv_cache_grouping=object()))
    with pytest.raises(PlatformError, match=r"ModelConfig\.kv_cache_grouping"):
        get_kv_cache_configs(config, [llama_8b(num_layers=2)], [GiB])


class NotGroups(OnePerLayerBlockOuterBuilder):
    def get_kv_cache_groups(self, config, kv_cache_spec):  # type: ignore[no-untyped-def]
        return ["layers.0"]


def test_builder_returning_non_groups() -> None:
    use_builder(NotGroups)
    with pytest.raises(PlanningError, match="not a KVCacheGroupSpec"):
        get_kv_cache_configs(CONFIG, [llama_8b(num_layers=1)], [GiB])


class Mangled(OnePerLayerBlockOuterBuilder):
    """The one-group-per-layer placement with ``mangle`` applied to its tensors."""

    @staticmethod
    def mangle(tensors: list[KVCacheTensor]) -> list[KVCacheTensor]:
        return tensors

    def get_kv_cache_config_from_groups(self, config, kv_cache_groups, num_blocks):  # type: ignore[no-untyped-def]
        kv = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        tensors = self.mangle(list(kv.kv_cache_tensors))
        return dataclasses.replace(kv, kv_cache_tensors=tuple(tensors))


def _ghost(ts: list[KVCacheTensor]) -> list[KVCacheTensor]:
    return [dataclasses.replace(ts[0], layers=("ghost",)), *ts[1:]]


def _twice(ts: list[KVCacheTensor]) -> list[KVCacheTensor]:
    return [ts[0], dataclasses.replace(ts[1], layers=ts[0].layers), *ts[2:]]


def _shifted(ts: list[KVCacheTensor]) -> list[KVCacheTensor]:
    return [dataclasses.replace(ts[0], offset=1), *ts[1:]]


def _short_page(ts: list[KVCacheTensor]) -> list[KVCacheTensor]:
    return [dataclasses.replace(ts[0], page_size_bytes=ts[0].page_size_bytes // 2), *ts[1:]]


def _dense_blocks(ts: list[KVCacheTensor]) -> list[KVCacheTensor]:
    return [dataclasses.replace(ts[0], block_stride=ts[0].page_size_bytes // 2), *ts[1:]]


@pytest.mark.parametrize(
    ("mangle", "match"),
    [
        (_ghost, r"tensor backs 'ghost', a layer in no group"),
        (_twice, r"layer 'layers\.0' is backed by two tensors"),
        (lambda ts: ts[:-1], r"layers with no tensor: \['layers\.2'\]"),
        (_shifted, r"layer 'layers\.0' needs bytes \[1, \d+\) of a \d+-byte tensor"),
        (_short_page, r"holds 32768 bytes per block, its page needs 65536"),
        (_dense_blocks, r"layer 'layers\.0' blocks overlap each other"),
    ],
    ids=["unknown_layer", "two_tensors", "no_tensor", "out_of_bounds", "short_page", "overlap"],
)
def test_planner_checks_every_region_of_a_custom_placement(
    mangle: Callable[[list[KVCacheTensor]], list[KVCacheTensor]],
    match: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Mangled, "mangle", staticmethod(mangle))
    use_builder(Mangled)
    with pytest.raises(PlanningError, match=match):
        get_kv_cache_configs(CONFIG, [llama_8b(num_layers=3)], [GiB])


def test_unmangled_placement_passes_the_region_checks() -> None:
    use_builder(Mangled)
    (kv,) = get_kv_cache_configs(CONFIG, [llama_8b(num_layers=3)], [GiB])
    assert len(kv.kv_cache_tensors) == 3
