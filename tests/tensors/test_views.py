from __future__ import annotations

import dataclasses

import pytest

from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from pagedkv.specs import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

torch = pytest.importorskip("torch")

from pagedkv.tensors import TensorLayoutError, allocate_kv_cache, page_order  # noqa: E402

from .configs import DEVICES, block_outer_config, layer_outer_config  # noqa: E402


def full(bs: int = 4, heads: int = 2, head: int = 8, dtype: str = "float32") -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=head, dtype=dtype)


def page_bytes(memory, config: KVCacheConfig, layer: str, block: int):
    start, end = config.layer_regions()[layer].block_range(block)
    return memory.device_buffer[start:end]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_attention_view_matches_its_bytes(device: str, layout: str) -> None:
    spec = full(bs=4, heads=3, head=8)
    config = layer_outer_config([(spec, ["a", "b"])], num_blocks=5, layout=layout)
    memory = allocate_kv_cache(config, device)
    view = memory["a"]
    shape = (5, 2, 4, 3, 8) if layout == "NHD" else (5, 2, 3, 4, 8)
    assert view.layout == layout and view.tensor.shape == shape
    assert view.tensor.dtype == torch.float32 and view.tensor.device.type == device
    assert memory.device_buffer.numel() == config.device_bytes
    # Writing token 2, head 1 of block 3's value lands in that page at the layout's place.
    values = torch.arange(8, dtype=torch.float32, device=device) + 1
    if layout == "NHD":
        view.tensor[3, 1, 2, 1] = values
    else:
        view.tensor[3, 1, 1, 2] = values
    page = page_bytes(memory, config, "a", 3).view(torch.float32).reshape(2, -1)
    half = page[1].reshape(4, 3, 8) if layout == "NHD" else page[1].reshape(3, 4, 8)
    got = half[2, 1] if layout == "NHD" else half[1, 2]
    assert torch.equal(got, values)
    assert int(torch.count_nonzero(memory.device_buffer.view(torch.float32))) == 8
    assert torch.count_nonzero(memory["b"].tensor) == 0


def test_mla_view_is_one_latent_per_token() -> None:
    spec = MLAAttentionSpec(block_size=4, head_size=12, dtype="bfloat16")
    config = block_outer_config([(spec, ["m0", "m1"])], num_blocks=3)
    memory = allocate_kv_cache(config)
    view = memory["m1"]
    assert view.layout == "latent" and view.tensor.shape == (3, 4, 12)
    assert view.tensor.dtype == torch.bfloat16
    view.tensor[2, 3] = 7.0
    page = page_bytes(memory, config, "m1", 2).view(torch.bfloat16).reshape(4, 12)
    assert torch.all(page[3] == 7.0) and torch.count_nonzero(page[:3]) == 0
    assert torch.count_nonzero(memory["m0"].tensor) == 0


def test_mamba_views_pack_states_in_order() -> None:
    spec = MambaSpec(block_size=16, shapes=((3, 4), (2, 5)), dtypes=("float32", "bfloat16"))
    config = layer_outer_config([(spec, ["s"])], num_blocks=2)
    memory = allocate_kv_cache(config)
    conv, ssm = memory["s"].tensors
    assert memory["s"].layout == "state"
    assert conv.shape == (2, 3, 4) and conv.dtype == torch.float32
    assert ssm.shape == (2, 2, 5) and ssm.dtype == torch.bfloat16
    ssm[1] = 2.0
    page = page_bytes(memory, config, "s", 1)
    assert torch.count_nonzero(page[:48]) == 0
    assert torch.all(page[48:68].view(torch.bfloat16) == 2.0)
    with pytest.raises(TensorLayoutError, match="s"):
        _ = memory["s"].tensor


def test_misaligned_mamba_state_is_a_named_error() -> None:
    spec = MambaSpec(block_size=16, shapes=((3,), (2,)), dtypes=("bfloat16", "float32"))
    config = layer_outer_config([(spec, ["ssm.7"])], num_blocks=2)
    with pytest.raises(TensorLayoutError, match=r"ssm\.7.*element size"):
        allocate_kv_cache(config)


def test_padded_pages_keep_block_stride() -> None:
    spec = FullAttentionSpec(
        block_size=2, num_kv_heads=1, head_size=4, dtype="float32", page_size_padded=96
    )
    config = layer_outer_config([(spec, ["a"])], num_blocks=3)
    view = allocate_kv_cache(config)["a"].tensor
    assert view.stride(0) == 96 // 4 and view.shape == (3, 2, 2, 1, 4)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (full(dtype="int8_per_token_head"), "packed format"),
        (
            FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, head_size_v=4),
            "head_size_v",
        ),
        (
            FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, state_content_bytes=9),
            "packed per-head",
        ),
    ],
)
def test_unviewable_layers_are_named(spec: FullAttentionSpec, match: str) -> None:
    config = layer_outer_config([(spec, ["layer.3"])], num_blocks=2)
    with pytest.raises(TensorLayoutError, match=rf"layer\.3.*{match}|{match}.*layer\.3"):
        allocate_kv_cache(config)


def test_plan_inconsistencies_are_errors() -> None:
    spec = full()
    good = layer_outer_config([(spec, ["a"])], num_blocks=4)
    small = KVCacheTensor(
        size=spec.page_size_bytes * 3,
        layers=("a",),
        layer_stride=0,
        block_stride=spec.page_size_bytes,
        page_size_bytes=spec.page_size_bytes,
    )
    too_small = KVCacheConfig(
        num_blocks=4, kv_cache_tensors=(small,), kv_cache_groups=good.kv_cache_groups
    )
    with pytest.raises(TensorLayoutError, match="hold 3 blocks, fewer than num_blocks=4"):
        allocate_kv_cache(too_small)
    unbacked = KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=good.kv_cache_tensors,
        kv_cache_groups=(KVCacheGroupSpec(layer_names=("a", "b"), kv_cache_spec=spec),),
    )
    with pytest.raises(TensorLayoutError, match=r"\['b'\].*no tensor"):
        allocate_kv_cache(unbacked)
    orphan = KVCacheConfig(num_blocks=4, kv_cache_tensors=good.kv_cache_tensors, kv_cache_groups=())
    with pytest.raises(TensorLayoutError, match=r"\['a'\].*in no KV cache group"):
        allocate_kv_cache(orphan)
    with pytest.raises(TensorLayoutError, match="XYZ"):
        allocate_kv_cache(layer_outer_config([(spec, ["a"])], num_blocks=4, layout="XYZ"))


def test_page_order_names() -> None:
    assert page_order("nhd") == "NHD" and page_order("HND") == "HND"
    assert page_order("LBNHC") == "NHD" and page_order("BLHNC") == "HND"
    with pytest.raises(TensorLayoutError):
        page_order("LBNNC")


def test_host_resident_tensors_get_their_own_buffer() -> None:
    spec = full()
    page = spec.page_size_bytes
    device = KVCacheTensor(
        size=page * 4, layers=("d",), layer_stride=0, block_stride=page, page_size_bytes=page
    )
    host = KVCacheTensor(
        size=page * 2 * 6,
        layers=("h0", "h1"),
        layer_stride=page * 6,
        block_stride=page,
        page_size_bytes=page,
        host_resident=True,
    )
    config = KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=(device, host),
        kv_cache_groups=(
            KVCacheGroupSpec(layer_names=("d",), kv_cache_spec=spec),
            KVCacheGroupSpec(layer_names=("h0", "h1"), kv_cache_spec=spec, host_resident=True),
        ),
    )
    memory = allocate_kv_cache(config)
    assert memory.num_blocks == 4 and memory.num_host_blocks == 6
    assert memory.device_buffer.numel() == page * 4 and memory.host_buffer.numel() == page * 12
    assert memory["h1"].tensor.shape[0] == 6 and memory["d"].tensor.shape[0] == 4
    assert memory["h1"].group_id == 1
    memory["h1"].tensor.fill_(1.0)
    assert torch.count_nonzero(memory.device_buffer) == 0
    assert torch.count_nonzero(memory["h0"].tensor) == 0


def test_sliding_window_layers_get_attention_views() -> None:
    spec = SlidingWindowSpec(
        block_size=4, num_kv_heads=2, head_size=8, dtype="float16", sliding_window=8
    )
    config = layer_outer_config([(full(dtype="float16"), ["f"]), (spec, ["w"])], num_blocks=3)
    memory = allocate_kv_cache(config)
    assert memory["w"].tensor.shape == (3, 2, 4, 2, 8) and memory["w"].group_id == 1
    assert set(memory) == {"f", "w"} and len(memory) == 2
    with pytest.raises(TensorLayoutError, match="nope"):
        memory["nope"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _PlainFullSpec(FullAttentionSpec):
    """A new kind without a builder of its own."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _CustomViewSpec(FullAttentionSpec):
    """A new kind that registers its own view builder."""


def test_view_builders_follow_the_spec_mro_and_can_be_registered(monkeypatch) -> None:
    from pagedkv.tensors import ViewRequest, register_view_builder, views

    monkeypatch.setattr(views, "_BUILDERS", dict(views._BUILDERS))

    @register_view_builder(_CustomViewSpec)
    def flat_pages(request: ViewRequest) -> tuple[str, tuple[torch.Tensor, ...]]:
        region = request.region
        pages = request.buffer[region.offset : region.offset + region.page_size_bytes]
        return "flat", (pages,)

    plain = _PlainFullSpec(block_size=4, num_kv_heads=2, head_size=8)
    custom = _CustomViewSpec(block_size=4, num_kv_heads=2, head_size=8)
    config = layer_outer_config([(plain, ["plain"]), (custom, ["custom"])], num_blocks=2)
    memory = allocate_kv_cache(config)
    assert memory["plain"].layout == "NHD"  # inherited from AttentionSpec's builder
    assert memory["plain"].tensor.shape == (2, 2, 4, 2, 8)
    assert memory["custom"].layout == "flat"
    assert memory["custom"].tensor.numel() == custom.page_size_bytes


def test_a_spec_without_any_view_builder_is_named(monkeypatch) -> None:
    from pagedkv.specs import AttentionSpec
    from pagedkv.tensors import views

    builders = {k: v for k, v in views._BUILDERS.items() if k is not AttentionSpec}
    monkeypatch.setattr(views, "_BUILDERS", builders)
    config = layer_outer_config([(full(), ["layer.0"])], num_blocks=2)
    with pytest.raises(TensorLayoutError, match=r"'layer\.0'.*FullAttentionSpec.*register"):
        allocate_kv_cache(config)
