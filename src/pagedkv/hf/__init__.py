"""transformers models generating through pagedkv's plan, blocks and tensors
(needs the ``hf`` and ``torch`` extras).

The names below are imported on first access, so ``pagedkv.hf.tokenizer`` (the router's
tokenizer) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedkv.hf.attention import ATTENTION_NAME, HFIntegrationError, register_attention
    from pagedkv.hf.engine import GenerationOutput, PagedGenerator
    from pagedkv.hf.figures import CacheFigures
    from pagedkv.hf.tiny import seeded_model, tiny_config

__all__ = [
    "ATTENTION_NAME",
    "CacheFigures",
    "GenerationOutput",
    "HFIntegrationError",
    "PagedGenerator",
    "register_attention",
    "seeded_model",
    "tiny_config",
]

_HOME = {
    "ATTENTION_NAME": "pagedkv.hf.attention",
    "HFIntegrationError": "pagedkv.hf.attention",
    "register_attention": "pagedkv.hf.attention",
    "GenerationOutput": "pagedkv.hf.engine",
    "PagedGenerator": "pagedkv.hf.engine",
    "CacheFigures": "pagedkv.hf.figures",
    "seeded_model": "pagedkv.hf.tiny",
    "tiny_config": "pagedkv.hf.tiny",
}


def __getattr__(name: str) -> object:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'pagedkv.hf' has no attribute {name!r}")
