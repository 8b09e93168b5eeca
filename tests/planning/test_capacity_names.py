"""The capacity report sits above the core planner; pagedkv.planning still answers its names."""

from __future__ import annotations

import pytest

import pagedkv.capacity
import pagedkv.planning

MOVED = ["ConcurrencyPoint", "GroupReport", "GroupingAlternative", "KVCachePlan", "WorkerReport"]


@pytest.mark.parametrize("name", [*MOVED, "plan_kv_cache"])
def test_planning_answers_the_capacity_names(name: str) -> None:
    assert getattr(pagedkv.planning, name) is getattr(pagedkv.capacity, name)


def test_unknown_names_still_fail() -> None:
    with pytest.raises(AttributeError, match="no attribute 'KVCachePlans'"):
        pagedkv.planning.KVCachePlans  # noqa: B018

