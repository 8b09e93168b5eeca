"""HiSparse tier sizing: host pool, hot buffer rows, hot-group packing, concurrency."""

from __future__ import annotations

import pytest

from pagedkv.errors import PlanningError
from pagedkv.planning.hisparse import (
    MAX_HOT_ROWS,
    HostPoolPlan,
    hot_rows_per_request,
    pack_hot_units,
    plan_host_pool,
    steady_state_concurrency,
)


@pytest.mark.parametrize(("spare", "fits"), [(1, False), (2, True)])
def test_host_pool_must_hold_one_longest_request_plus_spares(spare: int, fits: bool) -> None:
    budget = (4 + spare) * 100  # 4 pages of a 64-token request, then the spares
    if fits:
        assert plan_host_pool(100, budget, max_model_len=256, block_size=64) == HostPoolPlan(6, 100)
    else:
        with pytest.raises(PlanningError, match="increase host_pool_gib"):
            plan_host_pool(100, budget, max_model_len=256, block_size=64)


def test_host_pool_blocks_are_padded_to_the_alignment() -> None:
    plan = plan_host_pool(100, 4096 * 10, max_model_len=64, block_size=64, alignment_bytes=4096)
    assert plan == HostPoolPlan(10, 4096)
    with pytest.raises(PlanningError, match="holds no"):
        plan_host_pool(100, 99, max_model_len=64, block_size=64)


def test_hot_rows_default_to_one_top_k_of_slack_and_must_cover_every_query() -> None:
    assert hot_rows_per_request(128, 1) == 256
    assert hot_rows_per_request(128, 3) == 512
    assert hot_rows_per_request(128, 2, device_buffer_size=256) == 256
    with pytest.raises(PlanningError, match="cover every decode query"):
        hot_rows_per_request(128, 2, device_buffer_size=255)
    with pytest.raises(PlanningError, match="int16"):
        hot_rows_per_request(MAX_HOT_ROWS, 1)


def test_hot_units_pack_up_to_the_budget_and_stay_whole() -> None:
    units = [[("a", 10), ("b", 10)], [("c", 10)], [("d", 30)], [("e", 5)]]
    assert pack_hot_units(units, 30) == [
        [("a", 10), ("b", 10), ("c", 10)],
        [("d", 30)],
        [("e", 5)],
    ]
    assert pack_hot_units([[("big", 50)]], 30) == [[("big", 50)]]


def test_steady_state_charges_the_newest_request_its_full_window() -> None:
    # Admission 24 blocks, steady 16: 1 + (64 - 24) / 16.
    assert steady_state_concurrency(64, 24, 16, 100, 10) == 3.5
    assert steady_state_concurrency(12, 24, 16, 100, 10) == 0.5
    assert steady_state_concurrency(64, 24, 16, 20, 10) == 2.0  # the host pool bounds it
    with pytest.raises(PlanningError, match="steady_blocks"):
        steady_state_concurrency(64, 24, 0, 100, 10)
