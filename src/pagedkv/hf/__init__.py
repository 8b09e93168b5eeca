"""transformers models generating through pagedkv's plan, blocks and tensors
(needs the ``hf`` and ``torch`` extras)."""

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
