"""Allocate the backing buffers a KVCacheConfig describes and view every layer in them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from pagedkv.planning.types import KVCacheConfig, KVCacheTensor, LayerRegion
from pagedkv.specs import KVCacheSpec
from pagedkv.tensors.errors import TensorLayoutError
from pagedkv.tensors.views import LayerView, ViewRequest, build_layer_views, page_order

__all__ = [
    "KVCacheMemory",
    "blocks_that_fit",
    "layer_specs",
    "allocate_kv_cache",
]


@dataclass(frozen=True, eq=False)
class KVCacheMemory:
    """The buffers of one worker's KV cache and a typed view per layer.

    ``device_buffer`` is the one device allocation every device tensor points into;
    ``host_buffer`` backs host-resident tensors (``None`` when there are none).
    """

    num_blocks: int
    num_host_blocks: int
    device_buffer: torch.Tensor | None
    host_buffer: torch.Tensor | None
    layers: Mapping[str, LayerView]

    def __getitem__(self, layer_name: str) -> LayerView:
        try:
            return self.layers[layer_name]
        except KeyError:
            raise TensorLayoutError(f"layer {layer_name!r} has no KV cache view") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)


def blocks_that_fit(tensors: Sequence[KVCacheTensor]) -> int:
    """The most blocks every layer region of ``tensors`` can hold inside its tensor."""
    counts = [
        (t.size - r.offset - r.page_size_bytes) // r.block_stride + 1
        for t in tensors
        for r in t.regions()
        if r.block_stride > 0
    ]
    return max(min(counts, default=0), 0)


def layer_specs(config: KVCacheConfig) -> dict[str, tuple[int, KVCacheSpec]]:
    """Group id and own spec of every layer of ``config``."""
    return {
        name: (gid, spec)
        for gid, group in enumerate(config.kv_cache_groups)
        for name, spec in group.layer_specs().items()
    }


def _buffer(size_bytes: int, device: torch.device, pin_memory: bool) -> torch.Tensor | None:
    if size_bytes == 0:
        return None
    pin = pin_memory and device.type == "cpu" and torch.cuda.is_available()
    return torch.zeros(size_bytes, dtype=torch.uint8, device=device, pin_memory=pin)


def _check_regions(config: KVCacheConfig, specs: Mapping[str, tuple[int, KVCacheSpec]]) -> None:
    regions = config.layer_regions()
    if orphans := sorted(regions.keys() - specs.keys()):
        raise TensorLayoutError(f"layers {orphans} are backed by a tensor but in no KV cache group")
    if unbacked := sorted(specs.keys() - regions.keys()):
        raise TensorLayoutError(f"layers {unbacked} are in a KV cache group but have no tensor")
    for name, region in regions.items():
        page = specs[name][1].page_size_bytes
        if region.page_size_bytes < page:
            raise TensorLayoutError(
                f"layer {name!r}: region page {region.page_size_bytes} bytes is smaller than "
                f"its spec's page {page} bytes"
            )


def _views(
    buffer: torch.Tensor | None,
    regions: Sequence[LayerRegion],
    specs: Mapping[str, tuple[int, KVCacheSpec]],
    num_blocks: int,
    order: str,
) -> dict[str, LayerView]:
    views: dict[str, LayerView] = {}
    for region in regions:
        assert buffer is not None
        gid, spec = specs[region.layer_name]
        request = ViewRequest(buffer, region, spec, num_blocks, order)
        layout, tensors = build_layer_views(request)
        views[region.layer_name] = LayerView(region.layer_name, gid, spec, layout, tensors)
    return views


def allocate_kv_cache(
    config: KVCacheConfig,
    device: str | torch.device = "cpu",
    *,
    host_device: str | torch.device = "cpu",
    pin_host_memory: bool = True,
) -> KVCacheMemory:
    """Allocate ``config``'s buffers (zeroed) on ``device`` and view every layer.

    One device buffer of ``config.device_bytes`` backs every device tensor; host-resident
    tensors share one buffer on ``host_device`` (pinned when CUDA is present and
    ``pin_host_memory``). Raises TensorLayoutError naming the layer when a region does
    not fit its tensor or cannot be viewed in the layer's dtype and layout.

    Args:
        config: the planned KV cache config.
        device: where the device tensors go.
        host_device: where host-resident tensors go.
        pin_host_memory: pin the host buffer when CUDA is present.
    """
    specs = layer_specs(config)
    _check_regions(config, specs)
    order = page_order(config.kv_cache_layout)
    device_tensors, host_tensors = config.device_tensors, config.host_tensors
    if device_tensors and blocks_that_fit(device_tensors) < config.num_blocks:
        raise TensorLayoutError(
            f"device KV cache tensors hold {blocks_that_fit(device_tensors)} blocks, "
            f"fewer than num_blocks={config.num_blocks}"
        )
    device_buffer = _buffer(config.device_bytes, torch.device(device), pin_memory=False)
    host_bytes = max((t.size for t in host_tensors), default=0)
    host_buffer = _buffer(host_bytes, torch.device(host_device), pin_host_memory)
    num_host_blocks = blocks_that_fit(host_tensors)
    layers = _views(
        device_buffer,
        [r for t in device_tensors for r in t.regions()],
        specs,
        config.num_blocks,
        order,
    )
    layers |= _views(
        host_buffer, [r for t in host_tensors for r in t.regions()], specs, num_host_blocks, order
    )
    for layer, target in config.shared_kv_cache_layers:
        # Cross-layer KV sharing: the layer reads (and writes) its target's tensors.
        layers[layer] = layers[target]._replace(layer_name=layer)
    return KVCacheMemory(config.num_blocks, num_host_blocks, device_buffer, host_buffer, layers)
