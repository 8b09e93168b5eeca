"""Host copies of KV cache blocks: the data path of the host tier.

``HostKVBuffer`` holds, for every layer of a ``KVCacheMemory``, a host tensor of
``num_host_blocks`` blocks shaped like the layer's device blocks (pinned when CUDA is
present). ``store`` copies device blocks to host blocks, ``load`` the reverse, each for
the layers of one KV cache group. On CUDA the copies run on a side stream and return a
``Transfer`` to wait on (vLLM's offloading worker does the same with its own kernels);
on CPU they are plain copies, done when the call returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedkv.tensors.allocation import KVCacheMemory
from pagedkv.tensors.errors import BlockTableError

__all__ = [
    "Transfer",
    "HostKVBuffer",
]


class Transfer:
    """A batch of block copies; ``wait()`` makes the current stream wait for it."""

    def __init__(self, event: torch.cuda.Event | None = None) -> None:
        self._event = event

    def done(self) -> bool:
        return self._event is None or bool(self._event.query())

    def wait(self) -> None:
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)


class HostKVBuffer:
    """Host blocks for every layer of ``memory`` (``num_host_blocks`` of each)."""

    def __init__(self, memory: KVCacheMemory, num_host_blocks: int) -> None:
        if num_host_blocks < 1:
            raise BlockTableError(f"HostKVBuffer needs at least one block, got {num_host_blocks}")
        self.num_host_blocks = num_host_blocks
        self.num_device_blocks = memory.num_blocks
        pin = torch.cuda.is_available()
        # (device, host) tensor pairs of every offloaded layer, by KV cache group
        self.tensors_by_group: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._device: torch.device | None = None
        for name in memory:
            view = memory[name]
            if view.tensors[0].shape[0] != memory.num_blocks:
                continue  # a host-resident layer: nothing to offload
            host = tuple(
                torch.empty(
                    (num_host_blocks, *t.shape[1:]), dtype=t.dtype, device="cpu", pin_memory=pin
                )
                for t in view.tensors
            )
            pairs = self.tensors_by_group.setdefault(view.group_id, [])
            pairs.extend(zip(view.tensors, host, strict=True))
            self._device = view.tensors[0].device
        self._stream = (
            torch.cuda.Stream(self._device)
            if self._device is not None and self._device.type == "cuda"
            else None
        )

    def store(self, pairs: Sequence[tuple[int, int]], group_id: int = 0) -> Transfer:
        """Copy device block ``d`` to host block ``h`` for each ``(d, h)`` in ``pairs``."""
        self._check(pairs, self.num_device_blocks, self.num_host_blocks)
        return self._copy(pairs, group_id, to_host=True)

    def load(self, pairs: Sequence[tuple[int, int]], group_id: int = 0) -> Transfer:
        """Copy host block ``h`` to device block ``d`` for each ``(h, d)`` in ``pairs``."""
        self._check(pairs, self.num_host_blocks, self.num_device_blocks)
        return self._copy(pairs, group_id, to_host=False)

    def _copy(self, pairs: Sequence[tuple[int, int]], group_id: int, to_host: bool) -> Transfer:
        if not pairs:
            return Transfer()
        tensors = self.tensors_by_group.get(group_id, [])
        stream = self._stream
        if stream is None:  # CPU: one gather and one scatter per tensor
            src = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
            dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
            for dev, hst in tensors:
                if to_host:
                    hst.index_copy_(0, dst, dev.index_select(0, src))
                else:
                    dev.index_copy_(0, dst, hst.index_select(0, src))
            return Transfer()
        # CUDA: block by block between device and pinned host memory, on the side stream
        # after the work queued so far (the blocks' content) on the current stream.
        stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(stream):
            for dev, hst in tensors:
                for src_block, dst_block in pairs:
                    if to_host:
                        hst[dst_block].copy_(dev[src_block], non_blocking=True)
                    else:
                        dev[dst_block].copy_(hst[src_block], non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        return Transfer(event)

    @staticmethod
    def _check(pairs: Sequence[tuple[int, int]], num_src: int, num_dst: int) -> None:
        for src, dst in pairs:
            if not (0 <= src < num_src and 0 <= dst < num_dst):
                raise BlockTableError(
                    f"block copy {src} -> {dst} is outside the pools ({num_src} source, "
                    f"{num_dst} destination blocks)"
                )
