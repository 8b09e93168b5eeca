"""Registering the example spec with a manager.

Block-scaled int8 layers live exactly as long as full-attention layers, so they
reuse pagedkv's full-attention manager, and they may share a uniform-type group
with other full-attention layers (uniform base ``FullAttentionSpec``).
"""

from __future__ import annotations

from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime import FullAttentionManager
from pagedkv.specs import FullAttentionSpec
from pagedkv_example_platform.spec import BlockScaledInt8Spec


def register_example_specs() -> None:
    """Entry point of group ``pagedkv.plugins``; also called by the platform.

    Registering the same thing twice is a no-op, so both routes may run.
    """
    KVCacheSpecRegistry.register(
        BlockScaledInt8Spec,
        manager_class=FullAttentionManager,
        uniform_type_base_spec=FullAttentionSpec,
    )
