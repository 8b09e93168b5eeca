from __future__ import annotations

from collections.abc import Iterator

import pytest

from pagedkv.platforms import PLATFORM_ENV, set_current_platform
from startup_state import reset_plugins, restore, snapshot


@pytest.fixture(autouse=True)
def clean_platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with the generic platform and leaves the registry as it was."""
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    set_current_platform(None)
    reset_plugins()
    saved = snapshot()
    yield
    restore(saved)
    set_current_platform(None)
    reset_plugins()
