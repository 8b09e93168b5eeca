"""The pytest plugin giving vLLM's tests their ``caplog_vllm`` fixture."""

from __future__ import annotations

import logging

import pytest

from pagedkv.compat.vllm.pytest_plugin import LOGGERS, propagating


def test_propagating_lets_caplog_see_the_loggers_and_restores_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vllm_logger = logging.getLogger("vllm.v1.core.kv_cache_planning")
    parent = logging.getLogger("vllm")
    parent.propagate = False
    try:
        with caplog.at_level("WARNING"), propagating(LOGGERS):
            vllm_logger.warning("seen through vllm")
        assert "seen through vllm" in caplog.text
        assert parent.propagate is False
        caplog.clear()
        vllm_logger.warning("not seen")
        assert "not seen" not in caplog.text
    finally:
        parent.propagate = True
