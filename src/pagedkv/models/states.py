"""Recurrent state of Mamba-1, Mamba-2 and gated DeltaNet layers, per tensor-parallel rank."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedkv.config import DEFAULT_GDN_PREFILL_KERNEL
from pagedkv.errors import ModelConfigError
from pagedkv.models.layers import StateShape, shard

__all__ = [
    "GDN_CHECKPOINT_ALIGNMENT_TOKENS",
    "Mamba1State",
    "Mamba2State",
    "GatedDeltaNetState",
]

if TYPE_CHECKING:
    from pagedkv.config import MambaCacheMode

# The token step at which FlashInfer's gated-DeltaNet prefill kernel (vLLM 0.33's on
# Hopper, and on Blackwell for 128-wide key heads) can emit a state; in align mode vLLM
# makes the hybrid block size a multiple of it.
GDN_CHECKPOINT_ALIGNMENT_TOKENS = 64


@dataclass(frozen=True)
class Mamba1State(StateShape):
    intermediate_size: int
    state_size: int
    conv_kernel: int

    mamba_type = "mamba1"

    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        inner = shard(model, "mamba intermediate size", self.intermediate_size, tp)
        return ((inner, self.conv_kernel - 1), (inner, self.state_size))


@dataclass(frozen=True)
class Mamba2State(StateShape):
    intermediate_size: int
    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int

    mamba_type = "mamba2"

    def prefill_checkpoint_alignment(
        self,
        block_size: int,
        mode: MambaCacheMode,
        gdn_prefill_kernel: str = DEFAULT_GDN_PREFILL_KERNEL,
    ) -> int | None:
        return 1  # vLLM's MambaMixer2 exports at any token

    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        heads = shard(model, "mamba num_heads", self.num_heads, tp)
        groups = self.n_groups
        if groups % tp:
            if groups != 1:
                raise ModelConfigError(
                    f"{model}: mamba n_groups ({groups}) must be 1 or divisible by "
                    f"tensor_parallel_size ({tp})"
                )
            groups = tp  # one group replicated onto every rank
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        conv = shard(model, "mamba conv dim", conv_dim, tp)
        return ((conv, self.conv_kernel - 1), (heads, self.head_dim, self.state_size))


@dataclass(frozen=True)
class GatedDeltaNetState(StateShape):
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    mamba_type = "gated_delta_net"

    def prefill_checkpoint_alignment(
        self,
        block_size: int,
        mode: MambaCacheMode,
        gdn_prefill_kernel: str = DEFAULT_GDN_PREFILL_KERNEL,
    ) -> int | None:
        # vLLM's GDN layer exports prefill checkpoints only in align mode, through
        # FlashInfer's prefill kernel (which emits states every 64 tokens), on the
        # prefix-cache grid: the block, kept a multiple of the kernel's step. Other
        # kernels (Triton/FLA before Hopper) cannot: the scheduler splits the prefill.
        if mode != "align" or gdn_prefill_kernel != "flashinfer":
            return None
        return math.lcm(block_size, GDN_CHECKPOINT_ALIGNMENT_TOKENS)

    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        shard(model, "linear_num_key_heads", self.num_key_heads, tp)
        heads_v = shard(model, "linear_num_value_heads", self.num_value_heads, tp)
        conv_dim = 2 * self.num_key_heads * self.key_head_dim
        conv_dim += self.num_value_heads * self.value_head_dim
        return (
            (conv_dim // tp, self.conv_kernel - 1),
            (heads_v, self.value_head_dim, self.key_head_dim),
        )
