from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedkv.platforms import PLATFORM_ENV, set_current_platform
from startup_state import InspectableRegistry, reset_plugins, restore, snapshot

from .managers import register_test_managers

PLUGIN_DATA = Path(__file__).resolve().parents[1] / "data" / "plugins"


@pytest.fixture(autouse=True)
def clean_platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts and ends with no resolved platform, no loaded plugins,
    no platform env var and the registry as it was."""
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    set_current_platform(None)
    reset_plugins()
    saved = snapshot()
    yield
    restore(saved)
    set_current_platform(None)
    reset_plugins()


@pytest.fixture
def registry() -> Iterator[type[InspectableRegistry]]:
    """An isolated registry holding only the test managers (no lazy built-ins)."""
    with InspectableRegistry.isolated(builtins=False):
        register_test_managers()
        yield InspectableRegistry


@pytest.fixture
def empty_registry() -> Iterator[type[InspectableRegistry]]:
    with InspectableRegistry.isolated(builtins=False):
        yield InspectableRegistry


@pytest.fixture
def plugin_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Put plugin directories from tests/data/plugins/ on sys.path for one test."""

    def add(*names: str) -> None:
        for name in names:
            monkeypatch.syspath_prepend(str(PLUGIN_DATA / name))

    before = set(sys.modules)
    yield add
    for name in set(sys.modules) - before:
        if name.startswith("pagedkv_test_"):
            del sys.modules[name]
