"""Families vLLM 0.33 serves with cache kinds pagedkv does not plan yet: each adapter
refuses with the kind it is missing, rather than planning the model wrongly."""

from __future__ import annotations

from pagedkv.errors import ModelConfigError
from pagedkv.models.adapters import ModelAdapter
from pagedkv.models.layers import ModelLayout
from pagedkv.models.source import ConfigView, ModelSource


class DeepseekV4Adapter(ModelAdapter):
    """DeepSeek-V4: vLLM keeps each compressor's state in a ``CircularBufferSpec``
    next to the compressed MLA layers."""

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        raise ModelConfigError(
            f"{view.model}: DeepSeek-V4 (model_type 'deepseek_v4') is not planned yet: vLLM "
            "gives its KV compressors a CircularBufferSpec, a cache kind pagedkv does not have"
        )
