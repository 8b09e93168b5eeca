"""RoPE that is the same for a position whatever else is in the forward pass.

transformers' long-RoPE (Phi-3.5, Phi-4-mini) picks its short or long factors from the
largest position in the pass, and its dynamic NTK RoPE rescales its frequencies from it:
under packing or chunked prefill a token would be rotated differently than with its
prompt alone. While pagedkv runs a model (and while its reference ``generate()`` runs),
these rotary embeddings are fixed by vLLM's rule instead:

- ``longrope``: the long factors for every position when the engine's max_model_len
  exceeds ``original_max_position_embeddings``, the short ones otherwise;
- ``dynamic``: the frequencies scaled for ``max_position_embeddings`` against
  ``max_trained_positions`` (vLLM's reading; transformers scales only past
  ``max_position_embeddings``, which pagedkv never runs, so without
  ``max_trained_positions`` both leave the base unscaled and nothing is fixed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pagedkv.errors import ConfigError

__all__ = ["RopeRule", "fixed_rope", "rope_rule"]

_BATCH_DEPENDENT = ("longrope", "dynamic")


@dataclass(frozen=True)
class RopeRule:
    """How a batch-dependent RoPE is fixed for a run; ``describe`` is for reports."""

    rope_type: str
    use_long_factors: bool
    max_model_len: int

    def describe(self) -> str:
        if self.rope_type == "longrope":
            which = "long" if self.use_long_factors else "short"
            return (
                f"longrope fixed to its {which} factors for every position (vLLM's rule for "
                f"max_model_len {self.max_model_len})"
            )
        return (
            "dynamic NTK RoPE fixed to vLLM's frequencies (scaled for max_position_embeddings "
            "over max_trained_positions)"
        )


def _rotary_modules(model: Any) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "rope_type") and hasattr(m, "inv_freq")]


def _original_max(config: Any) -> int | None:
    params = getattr(config, "rope_parameters", None) or {}
    value = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
    value = value or getattr(config, "original_max_position_embeddings", None)
    return int(value) if value else None


def rope_rule(model: Any, max_model_len: int) -> RopeRule | None:
    """The rule fixing ``model``'s RoPE for runs up to ``max_model_len`` tokens (None: its
    RoPE does not depend on the batch)."""
    kinds = {m.rope_type if isinstance(m.rope_type, str) else "" for m in _rotary_modules(model)}
    for module in _rotary_modules(model):
        if isinstance(module.rope_type, dict) and any(
            k in str(v) for v in module.rope_type.values() for k in _BATCH_DEPENDENT
        ):
            raise ConfigError(
                f"{type(module).__name__}: per-layer-type RoPE {module.rope_type} includes a "
                "long-RoPE or dynamic kind, which pagedkv cannot fix per layer type"
            )
    if "longrope" in kinds:
        original = _original_max(model.config)
        if original is None:
            raise ConfigError("longrope config names no original_max_position_embeddings")
        return RopeRule("longrope", max_model_len > original, max_model_len)
    if any("dynamic" in k for k in kinds) and _trained_positions(model.config) is not None:
        return RopeRule("dynamic", False, max_model_len)
    return None


def _trained_positions(config: Any) -> int | None:
    """vLLM's ``max_trained_positions`` where it differs from the configured positions
    (transformers scales dynamic NTK only past ``max_position_embeddings``, which pagedkv
    never runs, so without it both leave the base unscaled)."""
    params = getattr(config, "rope_parameters", None) or {}
    trained = params.get("max_trained_positions") if isinstance(params, dict) else None
    if not trained or int(trained) == int(config.max_position_embeddings):
        return None
    return int(trained)


def _fixed_frequencies(module: Any, rule: RopeRule) -> torch.Tensor:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = module.config
    device = module.inv_freq.device
    original = module.original_inv_freq.to(device)
    if rule.rope_type == "longrope":
        if not rule.use_long_factors:
            return original
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](
            config, device, seq_len=(_original_max(config) or 0) + 1
        )
        return torch.as_tensor(long, device=device)
    positions = int(config.max_position_embeddings)
    trained = _trained_positions(config)
    if trained is None:
        return original  # vLLM's scaled base equals the base
    # transformers scales for seq_len against max_position_embeddings; vLLM for the
    # configured positions against the trained ones: the same for this seq_len
    seq_len = positions * positions // trained
    scaled, _ = ROPE_INIT_FUNCTIONS[module.rope_type](config, device, seq_len=seq_len)
    return torch.as_tensor(scaled, device=device)


@contextlib.contextmanager
def fixed_rope(model: Any, rule: RopeRule | None) -> Iterator[None]:
    """While open, ``model``'s batch-dependent rotary embeddings follow ``rule`` and no
    longer change with the pass (nothing changes with ``rule`` None)."""
    if rule is None:
        yield
        return
    saved = []
    for module in _rotary_modules(model):
        if module.rope_type not in _BATCH_DEPENDENT and "dynamic" not in module.rope_type:
            continue
        saved.append((module, module.rope_type, module.inv_freq))
        frequencies = _fixed_frequencies(module, rule)
        module.register_buffer("inv_freq", frequencies.clone(), persistent=False)
        module.rope_type = "default"
    try:
        yield
    finally:
        for module, kind, frequencies in saved:
            module.rope_type = kind
            module.register_buffer("inv_freq", frequencies, persistent=False)
