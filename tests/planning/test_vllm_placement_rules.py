"""vLLM 0.33's placement and grouping rules in pagedkv's planner: a tensor per spec,
block stride alignment, which layouts can express mixed pages, layout choice,
promotion of local layers, projection and cross-layer KV sharing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pagedkv import EngineConfig, FullAttentionSpec, SlidingWindowSpec
from pagedkv.errors import ConfigError, PlanningError
from pagedkv.planning.grouping import promote_local_specs, promote_to_full
from pagedkv.planning.layout import check_layout_expresses, choose_kv_cache_layout
from pagedkv.planning.placement import bytes_per_block, place_groups
from pagedkv.planning.sharing import layer_names_with_sharing
from pagedkv.planning.sizing import project_groups
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs import UniformTypeKVCacheSpecs


def attn(heads: int = 1, block_size: int = 16, **extra: Any) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=64, **extra)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlignedSpec(FullAttentionSpec):
    """A layer whose blocks must start every ``alignment`` bytes."""

    alignment_bytes: int = 1

    def block_stride_alignment_bytes(self) -> int:
        return self.alignment_bytes


def uniform(specs: dict[str, Any]) -> KVCacheGroupSpec:
    spec = UniformTypeKVCacheSpecs.from_specs(specs)
    assert spec is not None
    return KVCacheGroupSpec(layer_names=tuple(specs), kv_cache_spec=spec)


def config(layout: str) -> EngineConfig:
    return EngineConfig.create(kv_cache_layout=layout)


def test_layers_of_one_spec_share_a_tensor_whatever_their_order() -> None:
    big, small = attn(2), attn(1)
    group = uniform({"a": big, "b": small, "c": big})
    placed = place_groups(config("LBNHC"), [group], num_blocks=4)
    assert [t.layers for t in placed.kv_cache_tensors] == [("a", "c"), ("b",)]
    _, small_tensor = placed.kv_cache_tensors
    assert small_tensor.offset == 2 * big.page_size_bytes * 4


def test_layer_outer_pads_only_unaligned_pages() -> None:
    plain = attn(2)  # 8192-byte page, no alignment
    aligned = AlignedSpec(block_size=16, num_kv_heads=1, head_size=64, alignment_bytes=6000)
    assert aligned.page_size_bytes == 4096  # its stride rounds up to 6000
    group = uniform({"a": plain, "b": aligned})
    assert bytes_per_block([group]) == 8192 + 6000
    placed = place_groups(config("LBNHC"), [group], num_blocks=5)
    a, b = placed.kv_cache_tensors
    assert (a.block_stride, b.block_stride) == (8192, 6000)
    assert b.offset == 8192 * 5
    assert b.size == (8192 + 6000) * 5


def test_block_outer_rounds_the_block_to_every_alignment() -> None:
    aligned = AlignedSpec(block_size=16, num_kv_heads=1, head_size=64, alignment_bytes=3000)
    groups = [
        KVCacheGroupSpec(layer_names=("a",), kv_cache_spec=attn(2)),
        KVCacheGroupSpec(layer_names=("b",), kv_cache_spec=aligned),
    ]
    assert bytes_per_block(groups, block_outer=True) == 9000  # 8192 rounded to 3000s
    placed = place_groups(config("BLHNC"), groups, num_blocks=3)
    assert {t.block_stride for t in placed.kv_cache_tensors} == {9000}


@pytest.mark.parametrize("layout", ["LBNHC", "LHBNC", "BHLNC"])
def test_layouts_that_cannot_express_mixed_pages_raise(layout: str) -> None:
    groups = [uniform({"a": attn(2), "b": attn(1)}), uniform({"c": attn(2), "d": attn(1)})]
    with pytest.raises(PlanningError, match=f"{layout} cannot express"):
        check_layout_expresses(layout, groups)


def test_mixed_pages_fit_block_compact_layouts_and_pagedkv_names() -> None:
    one = [uniform({"a": attn(2), "b": attn(1)})]
    two = [*one, uniform({"c": attn(2), "d": attn(1)})]
    check_layout_expresses("LBNHC", one)  # one group: a region per layer
    check_layout_expresses("BLHNC", two)
    check_layout_expresses("NHD", two)  # pagedkv's names fall back to block-outer
    check_layout_expresses("LHBNC", [uniform({"a": attn(2), "b": attn(2)})])


def test_layout_choice_narrows_mixed_pages_to_block_compact() -> None:
    assert choose_kv_cache_layout(["LHBNC", "BLHNC"], [4096, 4096]) == "LHBNC"
    assert choose_kv_cache_layout(["LHBNC", "BLHNC"], [4096, 2048]) == "BLHNC"
    assert choose_kv_cache_layout(["LBNHC", "BLHNC"], [4096], "blhnc") == "BLHNC"
    with pytest.raises(ConfigError, match="not among"):
        choose_kv_cache_layout(["LHBNC", "BLHNC"], [4096, 2048], "LHBNC")
    with pytest.raises(ConfigError, match="block-compact"):
        choose_kv_cache_layout(["LHBNC", "BHLNC"], [4096, 2048])
    with pytest.raises(ConfigError, match="non-empty"):
        choose_kv_cache_layout([], [4096])


def test_promotion_keeps_padding_unless_the_real_page_outgrows_it() -> None:
    window = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, sliding_window=1024, page_size_padded=32768
    )
    assert window.real_page_size_bytes == 8192
    grown = promote_to_full(window, 32)  # real page 16384: the padding is kept
    assert isinstance(grown, FullAttentionSpec)
    assert (grown.block_size, grown.page_size_padded) == (32, 32768)
    larger = promote_to_full(window, 128)  # real page 65536 outgrows it
    assert larger.page_size_padded == 65536
    assert larger.sliding_window == 1024


def family(name: str, base: type) -> Any:
    """A spec class named like pagedkv's ``base``, defined in this module (a family)."""
    tag = ("tag", str, dataclasses.field(default="x"))
    namespace = {"__module__": __name__}
    return dataclasses.make_dataclass(
        name, [tag], bases=(base,), namespace=namespace, frozen=True, kw_only=True
    )


def test_promotion_keeps_the_layers_class_family() -> None:
    window_cls = family("SlidingWindowSpec", SlidingWindowSpec)
    full_cls = family("FullAttentionSpec", FullAttentionSpec)
    window = window_cls(block_size=16, num_kv_heads=1, head_size=64, sliding_window=8, tag="y")
    promoted = promote_to_full(window, None)
    assert type(promoted) is full_cls
    assert promoted.tag == "y"
    plain = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64, sliding_window=8)
    assert type(promote_to_full(plain, None)) is FullAttentionSpec


def test_local_layers_without_full_attention_are_not_promoted() -> None:
    specs = {
        "w": SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64, sliding_window=8),
        "w2": SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64, sliding_window=4),
    }
    with pytest.raises(PlanningError, match="cannot share one group"):
        promote_local_specs(specs)
    with_full = promote_local_specs({**specs, "f": attn()})
    assert all(isinstance(s, FullAttentionSpec) for s in with_full.values())


def test_projection_keeps_the_group_spec_class() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
    class Uniform(UniformTypeKVCacheSpecs):
        pass

    spec = Uniform(block_size=16, kv_cache_specs={"a": attn(2), "b": attn(1)})
    group = KVCacheGroupSpec(layer_names=("a", "b"), kv_cache_spec=spec)
    (projected,) = project_groups([group], {"a"})
    assert type(projected.kv_cache_spec) is Uniform
    assert list(projected.kv_cache_spec.kv_cache_specs) == ["a"]


def test_sharing_layers_follow_their_targets_group() -> None:
    groups = [
        KVCacheGroupSpec(layer_names=("l0",), kv_cache_spec=attn()),
        KVCacheGroupSpec(layer_names=("l1",), kv_cache_spec=attn()),
    ]
    names = layer_names_with_sharing(groups, {"l3": "l1", "l2": "l0", "l4": "l1"})
    assert names == [("l0", "l2"), ("l1", "l3", "l4")]
    with pytest.raises(PlanningError, match=r"'l9'.*in no KV cache group"):
        layer_names_with_sharing(groups, {"l5": "l9"})


def test_mla_beside_an_unfit_window_shares_one_full_allocation_group(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pagedkv import MLAAttentionSpec
    from pagedkv.planning.grouping import vllm_grouping

    target = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype="float32")
    indexer = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype="uint8")
    draft = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="float32", sliding_window=4
    )
    specs = {"target": target, "indexer": indexer, "draft": draft}
    with caplog.at_level("WARNING", logger="pagedkv.planning.grouping"):
        (group,) = vllm_grouping(config("LBNHC"), specs, 1).groups
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
    promoted = group.kv_cache_spec.kv_cache_specs["draft"]
    assert type(promoted) is FullAttentionSpec
    assert (promoted.block_size, promoted.sliding_window) == (64, 4)  # the MLA layers' size
    assert "attention compute is unchanged" in caplog.text
