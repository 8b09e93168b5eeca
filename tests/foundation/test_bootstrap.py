"""Start-up registration with the real built-ins and real plugins: order and once-only."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pagedkv.config import EngineConfig
from pagedkv.errors import KVCacheSpecError, RegistryError
from pagedkv.platforms import get_current_platform, resolve_obj_by_qualname, set_current_platform
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from startup_state import InspectableRegistry

from .spec_variants import ATTN

AddPath = Callable[..., None]

BUILTIN_SPECS = [
    FullAttentionSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    SlidingWindowMLASpec,
    ChunkedLocalAttentionSpec,
    MambaSpec,
    CrossAttentionSpec,
]


@pytest.fixture
def fresh_registry() -> Iterator[type[KVCacheSpecRegistry]]:
    """The registry as at import: nothing registered, start-up registration not run."""
    with InspectableRegistry.isolated(builtins=False):
        InspectableRegistry.reset()
        yield InspectableRegistry


def test_builtins_registered_lazily(fresh_registry: type[KVCacheSpecRegistry]) -> None:
    from pagedkv.runtime import FullAttentionManager, SlidingWindowManager

    assert fresh_registry.snapshot().specs == {}
    spec = FullAttentionSpec(**ATTN)
    assert fresh_registry.get_manager_class(spec) is FullAttentionManager
    specs = fresh_registry.registered_specs()
    assert set(BUILTIN_SPECS) <= set(specs)
    assert specs[MLAAttentionSpec].uniform_type_base_spec is FullAttentionSpec
    assert specs[SlidingWindowMLASpec].manager_class is SlidingWindowManager
    # Deliberately unregistered.
    assert EncoderOnlyAttentionSpec not in specs


def test_custom_spec_registered_first_keeps_real_builtins(
    fresh_registry: type[KVCacheSpecRegistry],
) -> None:
    # Edge 45 with the real built-ins.
    from pagedkv.runtime import FullAttentionManager, MambaManager

    from .test_registry import CustomFullSpec

    fresh_registry.register(CustomFullSpec, FullAttentionManager, FullAttentionSpec)
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=("bf16",))
    assert fresh_registry.get_manager_class(mamba) is MambaManager
    fresh_registry.check_kv_cache_spec_registry(
        {"a": FullAttentionSpec(**ATTN), "b": CustomFullSpec(**ATTN), "c": mamba}
    )


def test_start_up_order_builtins_platform_plugins(
    fresh_registry: type[KVCacheSpecRegistry], plugin_path: AddPath
) -> None:
    plugin_path("platform_a")
    import pagedkv_test_platform_a
    from pagedkv_test_platform_a.plugin import RingManager
    from pagedkv_test_platform_a.specs import PlatformAFullSpec, PluginRingSpec

    from pagedkv.runtime import FullAttentionManager

    fresh_registry.ensure_registered(EngineConfig())
    # The platform saw the built-ins; the general plugin saw the platform's spec.
    assert pagedkv_test_platform_a.EVENTS == [("platform", True), ("plugin", True)]
    spec = PlatformAFullSpec(**ATTN)
    assert fresh_registry.get_manager_class(spec) is FullAttentionManager
    assert fresh_registry.get_uniform_type_base_spec(spec) is FullAttentionSpec
    assert fresh_registry.get_manager_class(PluginRingSpec(**ATTN)) is RingManager
    # Once: more queries run nothing again.
    fresh_registry.get_manager_class(spec)
    fresh_registry.ensure_registered()
    assert len(pagedkv_test_platform_a.EVENTS) == 2


def test_plugin_spec_page_size_and_merge(
    fresh_registry: type[KVCacheSpecRegistry], plugin_path: AddPath
) -> None:
    plugin_path("platform_a")
    from pagedkv_test_platform_a.specs import PlatformAFullSpec

    spec = PlatformAFullSpec(**ATTN, header_bytes=128)
    assert spec.page_size_bytes == 65_536 + 128
    assert spec.kind == "platform_a_full_attention"
    with pytest.raises(KVCacheSpecError, match="'header_bytes'"):
        PlatformAFullSpec.merge([spec, PlatformAFullSpec(**ATTN)])
    layers = {"a": spec, "b": FullAttentionSpec(**ATTN)}
    fresh_registry.check_kv_cache_spec_registry(layers)
    assert spec.is_uniform_with_collection(layers)


def test_general_plugin_registers_spec_by_being_installed(
    fresh_registry: type[KVCacheSpecRegistry], plugin_path: AddPath
) -> None:
    plugin_path("general")
    import pagedkv_test_general
    from pagedkv_test_general import GeneralPluginWindowSpec

    from pagedkv.runtime import SlidingWindowManager

    spec = GeneralPluginWindowSpec(**ATTN, sliding_window=64)
    fresh_registry.check_kv_cache_spec_registry({"layer": spec})
    assert fresh_registry.get_manager_class(spec) is SlidingWindowManager
    assert pagedkv_test_general.CALLS == [1]
    assert get_current_platform().__name__ == "GenericPlatform"


def test_platform_selects_its_builder_by_qualname(plugin_path: AddPath) -> None:
    plugin_path("platform_a")
    qualname = get_current_platform().get_kv_cache_config_builder_cls(EngineConfig())
    assert qualname == "pagedkv_test_platform_a.builder.PlatformABuilder"
    builder_module = pytest.importorskip("pagedkv.planning.builder")
    builder_cls = resolve_obj_by_qualname(qualname)
    assert issubclass(builder_cls, builder_module.DefaultKVCacheConfigBuilder)
    assert builder_cls.chosen_by == "test_a"


@pytest.mark.parametrize(
    "spec",
    [EncoderOnlyAttentionSpec(**ATTN), AttentionSpec(**ATTN)],
    ids=lambda s: type(s).__name__,
)
def test_real_builtins_reject_unregistered_kinds(
    fresh_registry: type[KVCacheSpecRegistry], spec: object
) -> None:
    with pytest.raises(RegistryError) as info:
        fresh_registry.check_kv_cache_spec_registry(
            {"decoder.layers.0": FullAttentionSpec(**ATTN), "encoder.layers.3": spec}
        )
    assert "'encoder.layers.3'" in str(info.value)
    assert type(spec).__name__ in str(info.value)


def test_planning_builder_comes_from_the_platform_plugin(plugin_path: AddPath) -> None:
    from pagedkv.planning.builder import DefaultKVCacheConfigBuilder, get_kv_cache_config_builder

    assert type(get_kv_cache_config_builder(EngineConfig())) is DefaultKVCacheConfigBuilder
    set_current_platform(None)
    plugin_path("platform_a")
    builder = get_kv_cache_config_builder(EngineConfig())
    assert type(builder).__name__ == "PlatformABuilder"
    assert isinstance(builder, DefaultKVCacheConfigBuilder)
    assert get_kv_cache_config_builder(EngineConfig()) is not builder  # fresh per call
