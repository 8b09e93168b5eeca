"""Every bundled model's real plan can be laid out as tensors without clobbering."""

from __future__ import annotations

import pytest

from pagedkv.config import EngineConfig
from pagedkv.errors import InsufficientMemoryError

torch = pytest.importorskip("torch")
models = pytest.importorskip("pagedkv.models")

from pagedkv.planning.planner import get_kv_cache_configs  # noqa: E402
from pagedkv.tensors import allocate_kv_cache, find_unsafe_overlaps  # noqa: E402

EXPECTED_LAYOUTS = {"NHD", "latent", "state"}


def planned(name: str, tp: int = 1) -> list:
    model = models.load_model_config(name)
    for num_blocks in (48, 1024):  # encoder-decoder models need room for cross attention
        config = EngineConfig.create(
            block_size=16,
            max_model_len=-1,
            num_gpu_blocks_override=num_blocks,
            tensor_parallel_size=tp,
        )
        specs = models.get_kv_cache_specs(model, config=config)
        try:
            return get_kv_cache_configs(config, specs, [1 << 40] * len(specs))
        except InsufficientMemoryError:
            continue
    raise AssertionError(f"{name} does not plan even with 1024 blocks")


@pytest.mark.parametrize("name", models.list_bundled_models())
@pytest.mark.slow
def test_bundled_model_plan_views_without_overlap(name: str) -> None:
    for config in planned(name):
        assert find_unsafe_overlaps(config) == []
        memory = allocate_kv_cache(config, "meta")  # shapes and strides, no memory
        assert sorted(memory.layers) == sorted(config.layer_names)
        assert {v.layout for v in memory.layers.values()} <= EXPECTED_LAYOUTS
        for view in memory.layers.values():
            for tensor in view.tensors:
                assert tensor.shape[0] == config.num_blocks


def test_tensor_parallel_heads_shrink_the_views() -> None:
    (one,) = planned("Llama-3.1-8B")
    two = planned("Llama-3.1-8B", tp=2)
    assert len(two) == 2
    layer = one.layer_names[0]
    view_one = allocate_kv_cache(one, "meta")[layer].tensor
    view_two = allocate_kv_cache(two[1], "meta")[layer].tensor
    assert view_one.shape[1:] == (2, 16, 8, 128) and view_two.shape[1:] == (2, 16, 4, 128)
