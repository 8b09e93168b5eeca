"""A pytest plugin with the fixtures vLLM's own KV cache tests take from vLLM's test
suite conftest: ``caplog_vllm``. Registered as the ``pagedkv_vllm`` pytest11 entry
point, so it loads wherever pagedkv is installed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import pytest

__all__ = ["caplog_vllm", "propagating"]

# Loggers whose records vLLM's tests read: vLLM's names and the planner's.
LOGGERS = ("vllm", "pagedkv")


@contextlib.contextmanager
def propagating(names: Sequence[str] = LOGGERS) -> Iterator[None]:
    """The named loggers pass their records to the root logger (where ``caplog``
    listens) inside the block, and are restored after it."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.propagate = True
    try:
        yield
    finally:
        for logger, propagate in zip(loggers, saved, strict=True):
            logger.propagate = propagate


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` that also sees the ``vllm`` and ``pagedkv`` loggers' records."""
    with propagating():
        yield caplog
