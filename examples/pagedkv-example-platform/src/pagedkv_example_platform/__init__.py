"""Example pagedkv platform plugin: a block-scaled int8 KV cache format."""

from pagedkv_example_platform.spec import BlockScaledInt8Spec

__all__ = ["BlockScaledInt8Spec"]
