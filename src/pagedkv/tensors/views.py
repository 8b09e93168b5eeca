"""Typed per-layer views over a byte buffer, one builder per spec kind.

A builder turns a layer's :class:`~pagedkv.planning.LayerRegion` into torch views
with ``as_strided`` over the buffer reinterpreted as the layer's dtype. Builders are
looked up along the spec class's MRO, so a new spec kind registers its own with
:func:`register_view_builder` and the allocator does not change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from pagedkv.planning.types import LayerRegion
from pagedkv.specs import AttentionSpec, KVCacheSpec, MambaSpec, MLAAttentionSpec
from pagedkv.specs.local import SlidingWindowMLASpec
from pagedkv.tensors.dtypes import torch_dtype
from pagedkv.tensors.errors import TensorLayoutError

__all__ = [
    "PAGE_ORDERS",
    "LayerView",
    "ViewRequest",
    "ViewBuilder",
    "register_view_builder",
    "build_layer_views",
    "page_order",
    "strided_view",
    "attention_views",
    "latent_views",
    "mamba_views",
]

PAGE_ORDERS = ("NHD", "HND")


class LayerView(NamedTuple):
    """One layer's typed tensors over the shared buffer.

    ``layout`` is ``"NHD"``/``"HND"`` for K/V attention
    (``[num_blocks, 2, block_size, heads, head]`` / ``[num_blocks, 2, heads, block_size, head]``),
    ``"latent"`` for MLA (``[num_blocks, block_size, head]``) and ``"state"`` for Mamba
    (one ``[num_blocks, *shape]`` tensor per state).
    """

    layer_name: str
    group_id: int
    spec: KVCacheSpec
    layout: str
    tensors: tuple[torch.Tensor, ...]

    @property
    def tensor(self) -> torch.Tensor:
        """The layer's single tensor (attention and MLA layers)."""
        if len(self.tensors) != 1:
            raise TensorLayoutError(
                f"layer {self.layer_name!r} has {len(self.tensors)} tensors; use .tensors"
            )
        return self.tensors[0]


class ViewRequest(NamedTuple):
    """Everything a builder needs for one layer."""

    buffer: torch.Tensor  # uint8, one dimension
    region: LayerRegion
    spec: KVCacheSpec
    num_blocks: int
    page_order: str  # "NHD" or "HND"


ViewBuilder = Callable[[ViewRequest], tuple[str, tuple[torch.Tensor, ...]]]
_BUILDERS: dict[type, ViewBuilder] = {}


def register_view_builder(spec_cls: type) -> Callable[[ViewBuilder], ViewBuilder]:
    """Decorator: use ``builder`` for ``spec_cls`` and subclasses without their own."""

    def wrap(builder: ViewBuilder) -> ViewBuilder:
        _BUILDERS[spec_cls] = builder
        return builder

    return wrap


def build_layer_views(request: ViewRequest) -> tuple[str, tuple[torch.Tensor, ...]]:
    for cls in type(request.spec).__mro__:
        builder = _BUILDERS.get(cls)
        if builder is not None:
            return builder(request)
    raise TensorLayoutError(
        f"layer {request.region.layer_name!r}: no tensor view builder for "
        f"{type(request.spec).__name__}; register one with register_view_builder"
    )


def page_order(layout: str) -> str:
    """``"NHD"`` or ``"HND"``: how tokens and heads are ordered inside one page.

    Accepts those two names and the five-letter physical layouts (``"LBNHC"`` ...),
    where the relative order of N (tokens) and H (heads) decides.
    """
    name = layout.upper()
    if name in PAGE_ORDERS:
        return name
    if len(name) == 5 and set(name) == set("LBHNC"):
        return "NHD" if name.index("N") < name.index("H") else "HND"
    raise TensorLayoutError(
        f"KVCacheConfig.kv_cache_layout {layout!r} is not NHD, HND or a permutation of LBHNC"
    )


def strided_view(
    request: ViewRequest,
    dtype: torch.dtype,
    byte_offset: int,
    shape: Sequence[int],
    byte_strides: Sequence[int],
) -> torch.Tensor:
    """``as_strided`` over the buffer read as ``dtype``; offsets and strides in bytes.

    Args:
        request: the buffer, layer region and spec viewed.
        dtype: the element type the buffer is read as.
        byte_offset: where the view starts, in bytes.
        shape: the view's shape, in elements.
        byte_strides: the view's strides, in bytes.
    """
    name = request.region.layer_name
    size = dtype.itemsize
    if byte_offset % size or any(s % size for s in byte_strides):
        raise TensorLayoutError(
            f"layer {name!r}: offset {byte_offset} / strides {list(byte_strides)} bytes "
            f"are not multiples of the {dtype} element size {size}"
        )
    last = byte_offset + sum((n - 1) * s for n, s in zip(shape, byte_strides)) + size
    buffer_bytes = request.buffer.numel()
    if any(n == 0 for n in shape):
        last = 0
    if last > buffer_bytes:
        raise TensorLayoutError(
            f"layer {name!r}: its view ends at byte {last}, past the {buffer_bytes}-byte buffer"
        )
    typed = request.buffer[: buffer_bytes - buffer_bytes % size].view(dtype)
    strides = [s // size for s in byte_strides]
    return typed.as_strided(tuple(shape), tuple(strides), byte_offset // size)


def _check_plain(spec: AttentionSpec, name: str) -> None:
    if spec.state_content_bytes is not None:
        raise TensorLayoutError(
            f"layer {name!r}: packed per-head state ({spec.state_content_bytes} bytes) "
            "has no typed view"
        )


@register_view_builder(AttentionSpec)
def attention_views(request: ViewRequest) -> tuple[str, tuple[torch.Tensor, ...]]:
    spec = request.spec
    assert isinstance(spec, AttentionSpec)
    name = request.region.layer_name
    _check_plain(spec, name)
    if spec.head_size_v != spec.head_size:
        raise TensorLayoutError(
            f"layer {name!r}: head_size_v {spec.head_size_v} != head_size {spec.head_size}; "
            "a [num_blocks, 2, ...] K/V view needs equal K and V head sizes"
        )
    dtype = torch_dtype(spec.dtype, layer_name=name)
    esize = dtype.itemsize
    bs, heads, head = spec.block_size, spec.num_kv_heads, spec.head_size
    half = bs * heads * head * esize
    if request.page_order == "NHD":
        shape = (request.num_blocks, 2, bs, heads, head)
        inner = (half, heads * head * esize, head * esize, esize)
    else:
        shape = (request.num_blocks, 2, heads, bs, head)
        inner = (half, bs * head * esize, head * esize, esize)
    strides = (request.region.block_stride, *inner)
    return request.page_order, (
        strided_view(request, dtype, request.region.offset, shape, strides),
    )


def latent_views(request: ViewRequest) -> tuple[str, tuple[torch.Tensor, ...]]:
    spec = request.spec
    assert isinstance(spec, AttentionSpec)
    name = request.region.layer_name
    _check_plain(spec, name)
    if spec.num_kv_heads != 1:
        raise TensorLayoutError(
            f"layer {name!r}: an MLA latent view needs num_kv_heads == 1, got {spec.num_kv_heads}"
        )
    dtype = torch_dtype(spec.dtype, layer_name=name)
    esize = dtype.itemsize
    shape = (request.num_blocks, spec.block_size, spec.head_size)
    strides = (request.region.block_stride, spec.head_size * esize, esize)
    return "latent", (strided_view(request, dtype, request.region.offset, shape, strides),)


register_view_builder(MLAAttentionSpec)(latent_views)
register_view_builder(SlidingWindowMLASpec)(latent_views)


@register_view_builder(MambaSpec)
def mamba_views(request: ViewRequest) -> tuple[str, tuple[torch.Tensor, ...]]:
    spec = request.spec
    assert isinstance(spec, MambaSpec)
    name = request.region.layer_name
    views = []
    offset = request.region.offset
    for shape, dtype_name in zip(spec.shapes, spec.dtypes):
        dtype = torch_dtype(dtype_name, layer_name=name)
        esize = dtype.itemsize
        inner = [esize]
        for extent in reversed(shape[1:]):
            inner.insert(0, inner[0] * extent)
        strides = (request.region.block_stride, *inner)
        views.append(strided_view(request, dtype, offset, (request.num_blocks, *shape), strides))
        offset += math.prod(shape) * esize
    return "state", tuple(views)
