"""The order the suite runs in under pytest-xdist: the tests marked ``heavy`` (tens of
seconds each) first, and work stealing between the workers.

Collected in file order, the heaviest tests came last (tests/test_doc_figures.py, the
live router, vLLM's own suite): one worker ran them alone while the other sat idle. Put
first, they start at once on one worker; the rest of the suite is split evenly, and a
worker that runs out of tests takes half of what another still has queued (xdist's
``worksteal``), so the run ends with short tests on both workers.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    heavy = [item for item in items if item.get_closest_marker("heavy") is not None]
    if heavy:
        rest = [item for item in items if item.get_closest_marker("heavy") is None]
        items[:] = heavy + rest


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``worksteal`` where xdist would use its default ``load`` (``-n`` without ``--dist``);
    a distribution named on the command line is kept."""
    named = any(arg.startswith(("--dist", "-d")) for arg in config.invocation_params.args)
    if named or config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)
