"""The ``cache`` object transformers' layers call during a pagedkv forward pass.

Attention layers get their K/V back unchanged (the attention function writes and
reads pages); MLA layers get the latent contexts (:mod:`pagedkv.hf.latent`); Mamba
mixers get and update their states (:mod:`pagedkv.hf.state`). Only the methods those
layers call are implemented.
"""

from __future__ import annotations

from typing import Any

import torch

from pagedkv.hf.attention import HFIntegrationError, current_step
from pagedkv.hf.latent import latent_update
from pagedkv.hf.state import StateIO

__all__ = [
    "PagedCache",
]


class PagedCache:
    """The ``cache`` argument of a forward pass on a pagedkv step (``states``: the
    Mamba states of the one request in the pass, if the model has Mamba layers)."""

    is_compileable = False

    def __init__(self, states: StateIO | None = None) -> None:
        self.states = states

    def update(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        layer_idx: int,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' cache hook: MLA layers store their latents and get every request's
        context back; other layers' K/V pass through (the attention function writes them).

        Args:
            key: the new tokens' keys (an MLA layer's latents).
            value: the new tokens' values (an MLA layer's rotary keys).
            layer_idx: the layer's index in the model.
            kwargs: transformers' cache keyword arguments, unused.
        """
        step = current_step()
        view = step.layers[layer_idx]
        if view.layout == "latent":
            return latent_update(step, view, layer_idx, key, value)
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def _states(self, state_idx: int = 0) -> StateIO:
        if self.states is None:
            raise HFIntegrationError("a Mamba mixer ran in a pass without state blocks")
        if state_idx:
            raise HFIntegrationError(
                f"a mixer asked for state {state_idx}; pagedkv.hf maps one conv and one "
                "recurrent state per layer"
            )
        return self.states

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._states(state_idx).conv_state(layer_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._states(state_idx).recurrent_state(layer_idx)

    def update_conv_state(
        self,
        conv_states: torch.Tensor,
        layer_idx: int,
        state_idx: int = 0,
        conv_kernel_size: int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """transformers' conv-state hook: the previous inputs followed by ``conv_states``,
        the last kernel's worth kept in the request's state block.

        Args:
            conv_states: the new inputs of the convolution.
            layer_idx: the layer's index in the model.
            state_idx: which state of the layer (only 0 is mapped).
            conv_kernel_size: the convolution's kernel width (None: from the state block's shape).
        """
        return self._states(state_idx).update_conv(conv_states, layer_idx, conv_kernel_size)

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        return self._states(state_idx).update_recurrent(recurrent_states, layer_idx)
