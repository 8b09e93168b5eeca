"""A starting state for transformers' Mamba-1 prefill scan (Jamba).

transformers' ``mamba_selective_scan`` always starts from a zero state, so a prefill
cannot continue a cached checkpoint or an earlier chunk. While pagedkv runs a model,
every Mamba-1 mixer records, before it runs, the recurrent state its cache holds for
it, and the module's scan is replaced by one that starts from that state (a plain
torch loop over the sequence, the same discretisation as transformers'); with no
state it calls transformers' own scan.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["mamba1_initial_states", "selective_scan_from"]

# transformers modules whose mixers call a module-level ``mamba_selective_scan``
SCAN_NAME = "mamba_selective_scan"
_MIXER_CLASSES = ("JambaMambaMixer",)

_INITIAL_STATE: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "pagedkv_mamba1_initial_state", default=None
)


def selective_scan_from(
    initial_state: torch.Tensor,
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective scan over ``hidden_states`` (batch, channels, length) starting from
    ``initial_state`` (batch, channels, state size): the outputs and the final state.
    ``B`` and ``C`` are (batch, state size, length), as transformers passes them.

    Args:
        initial_state: the state to start from, (batch, channels, state size).
        hidden_states: the inputs, (batch, channels, length).
        dt: the step sizes, (batch, channels, length).
        A: the state matrix, (channels, state size).
        B: the input projections, (batch, state size, length).
        C: the output projections, (batch, state size, length).
        D: the skip connection per channel (None: none).
        z: the gate, (batch, channels, length) (None: ungated).
        delta_bias: added to ``dt`` per channel (None: none).
        delta_softplus: apply softplus to ``dt``.
    """
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    discrete_a = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    discrete_b = dt[:, :, :, None] * B.transpose(1, 2)[:, None, :, :].float()
    inputs = discrete_b * hidden_states[:, :, :, None].float()
    c_by_step = C.transpose(1, 2)
    state = initial_state.to(discrete_a.dtype)
    outputs = []
    for index in range(hidden_states.shape[-1]):
        state = discrete_a[:, :, index] * state + inputs[:, :, index]
        step = torch.matmul(state.to(input_dtype), c_by_step[:, index, :].unsqueeze(-1))
        outputs.append(step[:, :, 0])
    scan = torch.stack(outputs, dim=-1)
    if D is not None:
        scan = scan + hidden_states * D[None, :, None]
    if z is not None:
        scan = scan * F.silu(z)
    return scan, state


def _scan_with_initial_state(original: Callable[..., Any]) -> Callable[..., Any]:
    def scan(hidden_states: torch.Tensor, dt: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        initial = _INITIAL_STATE.get()
        if initial is None:
            return original(hidden_states, dt, *args, **kwargs)
        keep_state = bool(kwargs.pop("return_last_state", False))
        for ignored in ("use_mambapy", "use_associative_scan"):
            kwargs.pop(ignored, None)
        output, state = selective_scan_from(initial, hidden_states, dt, *args, **kwargs)
        return (output, state) if keep_state else output

    return scan


def _record_state(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    cache = kwargs.get("cache", kwargs.get("cache_params"))
    state = None if cache is None else cache.get_recurrent_state(module.layer_idx, state_idx=0)
    _INITIAL_STATE.set(state)


@contextlib.contextmanager
def mamba1_initial_states(model: Any) -> Iterator[None]:
    """While open, ``model``'s Mamba-1 mixers start their prefill scan from the state
    their cache holds (nothing changes for a model without them)."""
    mixers = [m for m in model.modules() if type(m).__name__ in _MIXER_CLASSES]
    if not mixers:
        yield
        return
    modules = {sys.modules[type(m).__module__] for m in mixers}
    originals = {mod: getattr(mod, SCAN_NAME) for mod in modules}
    hooks = [m.register_forward_pre_hook(_record_state, with_kwargs=True) for m in mixers]
    for mod, original in originals.items():
        setattr(mod, SCAN_NAME, _scan_with_initial_state(original))
    token = _INITIAL_STATE.set(None)
    try:
        yield
    finally:
        _INITIAL_STATE.reset(token)
        for hook in hooks:
            hook.remove()
        for mod, original in originals.items():
            setattr(mod, SCAN_NAME, original)
