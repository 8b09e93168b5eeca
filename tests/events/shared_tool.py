"""The independent event-stream checker, run from the shared tools beside the checkout.

The checker was written outside this project and validated against vLLM 0.33's own
publisher, so it stays where it lives (``../shared/tools/kv_events_subscriber.py``, next to
the repository in development and CI). Where it is absent, a test that uses it skips.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SHARED_TOOL = Path(__file__).resolve().parents[3] / "shared" / "tools" / "kv_events_subscriber.py"
MODULE_NAME = "kv_events_subscriber"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


class _Missing:
    """Stands in for the checker where it is absent: any use skips the calling test."""

    def __getattr__(self, name: str) -> Any:
        pytest.skip(f"needs the shared event checker at {SHARED_TOOL}")


checker: Any = _load(SHARED_TOOL) if SHARED_TOOL.is_file() else _Missing()
