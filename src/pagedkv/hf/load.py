"""Models for the engine: a local checkpoint, or any config shrunk with seeded weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pagedkv.errors import ModelConfigError
from pagedkv.hf.tiny import seeded_model, tiny_config
from pagedkv.models import load_model_config

__all__ = [
    "transformers_config",
    "load_tiny_model",
    "use_one_thread",
    "load_pretrained",
]


def transformers_config(model: str | Path) -> Any:
    """The transformers config of a bundled model name, directory or config.json
    (the language-model part of a multimodal config)."""
    from transformers import AutoConfig

    source = load_model_config(model)
    raw = dict(source.text_config)
    model_type = raw.pop("model_type", None)
    try:
        return AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError):
        import transformers

        raise ModelConfigError(
            f"{source.name}: transformers {transformers.__version__} has no config class "
            f"for model_type {model_type!r}"
        ) from None


def load_tiny_model(model: str | Path, *, seed: int = 0, **overrides: Any) -> Any:
    """``model``'s config shrunk (:func:`pagedkv.hf.tiny.tiny_config`) with seeded weights."""
    return seeded_model(tiny_config(transformers_config(model), **overrides), seed=seed)


def use_one_thread() -> None:
    """One torch thread: for tiny models thread hand-offs cost more than the arithmetic
    (a 64x128 linear took 8 ms with 2 threads on a loaded 2-core machine, 0.04 ms with 1)."""
    torch.set_num_threads(1)


def load_pretrained(path: str | Path) -> Any:
    """A local checkpoint directory, in float32 on the CPU (no network)."""
    from transformers import AutoModelForCausalLM

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ModelConfigError(f"{path}: not a model directory (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, local_files_only=True
        )
    except OSError as exc:
        raise ModelConfigError(
            f"{path}: cannot load weights ({exc}); use --tiny for seeded random weights"
        ) from None
    return model.eval()
