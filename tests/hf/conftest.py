"""Each test module skips itself without torch and transformers (``pytest.importorskip``
at its top); a conftest-level skip would stop a run of ``pytest tests/hf`` instead."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
