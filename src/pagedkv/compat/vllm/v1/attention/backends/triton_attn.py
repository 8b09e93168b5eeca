"""Names from vLLM's ``vllm.v1.attention.backends.triton_attn``.

vLLM's attention backends are outside the KV cache layer: importable, and constructing
one raises ``OutsideKVCacheLayerError``. What the Triton backend does to the KV cache spec
(``customize_spec``: the page packing of per-token-head quantization) is translated."""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedkv.compat.vllm._outside import outside_class
from pagedkv.dtypes import get_kv_dtype

__all__ = ["TritonAttentionBackend"]

# vLLM's per-token-head quantization modes (KVQuantMode values) -> pagedkv's packed
# formats, which carry one fp32 scale inline after each K and each V vector.
_PER_TOKEN_HEAD_FORMATS = {
    2: "int8_per_token_head",
    3: "fp8_per_token_head",
    4: "int4_per_token_head",
}


_Outside: Any = outside_class("TritonAttentionBackend", "attention backends", __name__)


class TritonAttentionBackend(_Outside):
    @classmethod
    def customize_spec(cls, spec: Any) -> Any:
        """A per-token-head quantized layer's spec with its packed content per head
        (``state_content_bytes``: K and V data plus their inline scales); any other
        spec, or one whose content is already given, unchanged."""
        fmt_name = _PER_TOKEN_HEAD_FORMATS.get(int(getattr(spec, "kv_quant_mode", 0)))
        if fmt_name is None or spec.state_content_bytes is not None:
            return spec
        fmt = get_kv_dtype(fmt_name)
        content = fmt.bytes_per_vector(spec.head_size) + fmt.bytes_per_vector(spec.head_size_v)
        return dataclasses.replace(spec, state_content_bytes=content)
