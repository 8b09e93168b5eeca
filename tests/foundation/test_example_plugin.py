"""The vendor example in examples/pagedkv-example-platform, pip-installed and exercised."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import distribution, entry_points
from pathlib import Path
from typing import Any

import pytest

from pagedkv.config import EngineConfig
from pagedkv.errors import KVCacheSpecError, PlanningError
from pagedkv.platforms import PLATFORM_GROUP, PLUGIN_GROUP, get_current_platform
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import FullAttentionSpec, UniformTypeKVCacheSpecs
from startup_state import isolated, reset

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pagedkv-example-platform"


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip-install the example (from a copy, so the source tree stays clean)."""
    # --no-build-isolation builds with the environment's setuptools (a Python 3.11
    # venv has it; the example's build backend).
    pytest.importorskip("setuptools")
    work = tmp_path_factory.mktemp("example")
    source = work / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = work / "site"
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
        "--no-build-isolation", "--no-index", "--target", str(target), str(source),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return target


@pytest.fixture
def example(installed_example: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The installed example on sys.path, with the registry as at process start."""
    monkeypatch.syspath_prepend(str(installed_example))
    with isolated(builtins=False):
        reset()
        import pagedkv_example_platform

        yield pagedkv_example_platform
    for name in [n for n in sys.modules if n.startswith("pagedkv_example_platform")]:
        del sys.modules[name]


def llama_like(spec_cls: type, num_layers: int = 4, **fields: Any) -> dict[str, Any]:
    return {
        f"model.layers.{i}.self_attn": spec_cls(
            block_size=32, num_kv_heads=8, head_size=128, **fields
        )
        for i in range(num_layers)
    }


def test_installed_distribution_declares_entry_points(example: Any) -> None:
    dist = distribution("pagedkv-example-platform")
    assert dist.version == "0.1.0"
    platforms = {ep.name: ep.value for ep in entry_points(group=PLATFORM_GROUP)}
    plugins = {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}
    assert platforms["example"] == "pagedkv_example_platform.platform:ExamplePlatform"
    assert plugins["example_specs"] == (
        "pagedkv_example_platform.registration:register_example_specs"
    )
    assert example.__file__.startswith(str(Path(dist.locate_file(""))))


def test_platform_is_selected_and_spec_registered_at_start_up(example: Any) -> None:
    from pagedkv.runtime import FullAttentionManager

    assert get_current_platform().__name__ == "ExamplePlatform"
    spec = example.BlockScaledInt8Spec(block_size=32, num_kv_heads=8, head_size=128)
    KVCacheSpecRegistry.check_kv_cache_spec_registry({"layer.0": spec})
    assert KVCacheSpecRegistry.get_manager_class(spec) is FullAttentionManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(spec) is FullAttentionSpec


def test_spec_page_counts_the_per_block_scales(example: Any) -> None:
    spec = example.BlockScaledInt8Spec(block_size=32, num_kv_heads=8, head_size=128)
    values = 32 * 8 * (128 + 128) * 1
    scales = 8 * 2 * 4
    assert spec.scale_bytes_per_block == scales
    assert spec.page_size_bytes == values + scales == 65_600
    assert spec.copy_with_new_block_size(64).page_size_bytes == 2 * values + scales
    assert spec.kind == "block_scaled_int8"
    with pytest.raises(KVCacheSpecError, match=r"BlockScaledInt8Spec\.dtype"):
        example.BlockScaledInt8Spec(block_size=32, num_kv_heads=8, head_size=128, dtype="bf16")
    with pytest.raises(KVCacheSpecError, match=r"BlockScaledInt8Spec\.scale_bytes"):
        example.BlockScaledInt8Spec(block_size=32, num_kv_heads=8, head_size=128, scale_bytes=0)
    with pytest.raises(KVCacheSpecError, match="'scale_bytes'"):
        example.BlockScaledInt8Spec.merge(
            [
                spec,
                example.BlockScaledInt8Spec(
                    block_size=32, num_kv_heads=8, head_size=128, scale_bytes=2
                ),
            ]
        )


def test_spec_registered_by_general_plugin_under_another_platform(
    example: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_PLATFORM", "generic")
    assert get_current_platform().__name__ == "GenericPlatform"
    spec = example.BlockScaledInt8Spec(block_size=16, num_kv_heads=8, head_size=128)
    KVCacheSpecRegistry.check_kv_cache_spec_registry({"layer.0": spec})


def test_platform_selects_the_example_builder(example: Any) -> None:
    from pagedkv.planning.builder import DefaultKVCacheConfigBuilder, get_kv_cache_config_builder

    builder = get_kv_cache_config_builder(EngineConfig())
    assert type(builder).__name__ == "ExampleKVCacheConfigBuilder"
    assert isinstance(builder, DefaultKVCacheConfigBuilder)
    declared = EngineConfig.create(
        kv_cache_config_builder="pagedkv.planning.builder.DefaultKVCacheConfigBuilder"
    )
    assert type(get_kv_cache_config_builder(declared)) is DefaultKVCacheConfigBuilder


def test_builder_groups_and_places_the_example_layers(example: Any) -> None:
    from pagedkv.planning.builder import get_kv_cache_config_builder

    config = EngineConfig.create(block_size=32, max_model_len=4096)
    layers = llama_like(example.BlockScaledInt8Spec)
    builder = get_kv_cache_config_builder(config)
    groups = builder.get_kv_cache_groups(config, layers)
    assert [set(g.layer_names) for g in groups] == [set(layers)]
    assert groups[0].kv_cache_spec.page_size_bytes == 65_600
    kv_config = builder.get_kv_cache_config_from_groups(config, groups, num_blocks=100)
    assert kv_config.num_blocks == 100
    assert kv_config.kv_cache_layout == "HND"
    assert kv_config.device_bytes == 100 * 4 * 65_600
    region = kv_config.layer_regions()["model.layers.0.self_attn"]
    assert region.page_size_bytes == 65_600


def test_builder_refuses_block_sizes_off_the_tile(example: Any) -> None:
    from pagedkv.planning.builder import get_kv_cache_config_builder

    config = EngineConfig.create(block_size=16)
    layers = {
        name: spec.copy_with_new_block_size(16)
        for name, spec in llama_like(example.BlockScaledInt8Spec).items()
    }
    with pytest.raises(PlanningError, match="multiple of the 32-token tile"):
        get_kv_cache_config_builder(config).get_kv_cache_groups(config, layers)


def test_example_layers_mix_with_full_attention(example: Any) -> None:
    layers = {
        **llama_like(example.BlockScaledInt8Spec, num_layers=2),
        "model.layers.9.self_attn": FullAttentionSpec(block_size=32, num_kv_heads=8, head_size=128),
    }
    assert UniformTypeKVCacheSpecs.is_uniform_type(layers)


def test_planning_a_model_counts_the_scales(example: Any) -> None:
    from pagedkv.planning import get_kv_cache_configs, plan_kv_cache

    config = EngineConfig.create(block_size=32, max_model_len=4096)
    layers = llama_like(example.BlockScaledInt8Spec)
    available = 100_000 * 4 * 65_600
    (kv_config,) = get_kv_cache_configs(config, [layers], [available])
    assert kv_config.num_blocks == available // (4 * 65_600)
    assert kv_config.device_bytes == kv_config.num_blocks * 4 * 65_600
    assert kv_config.kv_cache_layout == "HND"  # the example platform's layout
    # Without the scales the same memory holds more blocks.
    plain = llama_like(FullAttentionSpec, dtype="int8")
    (plain_config,) = get_kv_cache_configs(config, [plain], [available])
    assert plain_config.num_blocks == available // (4 * 65_536) > kv_config.num_blocks
    plan = plan_kv_cache(config, [layers], [available])
    assert plan.bytes_per_block == 4 * 65_600
    assert plan.num_blocks == kv_config.num_blocks
    (group,) = plan.groups
    assert group.kind == "block_scaled_int8"
    assert group.page_size_bytes == group.real_page_size_bytes == 4 * 65_600
    assert group.padding_bytes == 0


def test_planning_refuses_block_sizes_off_the_tile(example: Any) -> None:
    from pagedkv.planning import get_kv_cache_configs

    config = EngineConfig.create(block_size=16, max_model_len=4096)
    layers = {
        name: spec.copy_with_new_block_size(16)
        for name, spec in llama_like(example.BlockScaledInt8Spec).items()
    }
    with pytest.raises(PlanningError, match="32-token tile"):
        get_kv_cache_configs(config, [layers], [1 << 30])
