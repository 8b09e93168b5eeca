"""vLLM's ``vllm.platforms``: pagedkv's current platform under vLLM's names."""

from __future__ import annotations

from typing import Any

from pagedkv.platforms import Platform as _CorePlatform
from pagedkv.platforms import get_current_platform

__all__ = ["Platform", "current_platform"]


class Platform(_CorePlatform):
    """pagedkv's platform hooks, with vLLM's device queries."""

    device_type = "cpu"

    @classmethod
    def is_xpu(cls) -> bool:
        return False

    @classmethod
    def is_cuda(cls) -> bool:
        return False

    @classmethod
    def is_cpu(cls) -> bool:
        return True


class _Current:
    """``current_platform``: forwards to pagedkv's current platform."""

    def __getattr__(self, name: str) -> Any:
        platform = get_current_platform()
        if hasattr(platform, name):
            return getattr(platform, name)
        return getattr(Platform, name)


current_platform: Any = _Current()
