"""The request path stays short for a reader: admitting a request with a prefix hit on
gemma-3-27b-it's layout runs in 8 of pagedkv's files, a decode step in 1, each in the
request's order without turning back (benchmarks/call_path.py). Counts of files, not
timing: they do not depend on the machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "call_path.py"

ADMISSION_FILES = [
    "pagedkv/runtime/block_pool.py",
    "pagedkv/runtime/cached_log.py",
    "pagedkv/runtime/coordinators.py",
    "pagedkv/runtime/free_queue.py",
    "pagedkv/runtime/kv_cache_manager.py",
    "pagedkv/runtime/managers/base.py",
    "pagedkv/runtime/managers/full.py",
    "pagedkv/runtime/managers/sliding_window.py",
]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("call_path", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["call_path"] = module  # dataclass-like NamedTuples look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def steps() -> dict[str, dict[str, Any]]:
    if sys.getprofile() is not None:
        pytest.skip("a profiler (coverage?) is already installed")
    result: dict[str, dict[str, Any]] = _load().measure()
    return result


def _own_files(step: dict[str, Any]) -> list[str]:
    return [file for file in step["files"] if file.startswith("pagedkv/")]


def test_admission_goes_through_eight_files_in_one_direction(
    steps: dict[str, dict[str, Any]],
) -> None:
    admission = steps["admission"]
    assert _own_files(admission) == ADMISSION_FILES
    assert admission["backward_calls"] == []


def test_a_decode_step_stays_in_the_manager_file(steps: dict[str, dict[str, Any]]) -> None:
    decode = steps["decode"]
    # The manager runs the coordinator's idle-step check and skip steps inline; the
    # window groups' skip step waits for the next block to leave the window.
    assert _own_files(decode) == ["pagedkv/runtime/kv_cache_manager.py"]
    assert decode["backward_calls"] == []


@pytest.mark.parametrize("name", ["decode_block_full", "decode_new_block"])
def test_steps_that_allocate_or_cache_stay_in_the_admission_files(
    steps: dict[str, dict[str, Any]], name: str
) -> None:
    assert set(_own_files(steps[name])) <= set(ADMISSION_FILES)
    assert steps[name]["backward_calls"] == []


def test_a_call_back_up_the_request_order_is_reported() -> None:
    module = _load()
    edges = module.Counter(
        {
            ("pagedkv/runtime/managers/base.py", "pagedkv/runtime/coordinators.py"): 2,
            ("pagedkv/runtime/coordinators.py", "pagedkv/runtime/managers/base.py"): 1,
            ("pagedkv/runtime/block_pool.py", "pagedkv/runtime/stats.py"): 1,
        }
    )
    assert module.backward_calls(edges) == [
        "pagedkv/runtime/managers/base.py -> pagedkv/runtime/coordinators.py (2)"
    ]
