"""The rank-agreement rules of pagedkv.distributed, without torch or processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagedkv.distributed import (
    DistributedPlanningError,
    RankReport,
    check_reports,
    plan_digest,
)
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.specs import FullAttentionSpec

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64)


def test_agreeing_reports_pass_and_each_disagreement_is_named() -> None:
    ok = [RankReport(r, {"l0": SPEC, f"own{r}": SPEC}, 1 << 30, "1") for r in range(3)]
    check_reports(ok)
    with pytest.raises(DistributedPlanningError, match="different pagedkv versions"):
        check_reports([ok[0], ok[1]._replace(version="2")])
    with pytest.raises(DistributedPlanningError, match="rank 1: boom; rank 2: bang"):
        check_reports([ok[0], ok[1]._replace(error="boom"), ok[2]._replace(error="bang")])
    other = {"l0": FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64)}
    with pytest.raises(DistributedPlanningError, match=r"'l0'.*rank 0.*rank 2"):
        check_reports([ok[0], ok[1], ok[2]._replace(specs=other)])


def test_digest_ignores_layer_names_but_not_blocks_or_kinds() -> None:
    def config(names: tuple[str, ...], num_blocks: int = 10) -> KVCacheConfig:
        group = KVCacheGroupSpec(layer_names=names, kv_cache_spec=SPEC)
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=(group,))

    assert plan_digest(config(("a",))) == plan_digest(config(("b", "c")))  # two PP stages
    assert plan_digest(config(("a",))) != plan_digest(config(("a",), num_blocks=11))


@pytest.mark.slow
def test_importing_pagedkv_distributed_does_not_import_torch() -> None:
    code = "import sys, pagedkv, pagedkv.distributed; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_plan_outcomes_agree_or_every_rank_raises() -> None:
    from pagedkv.distributed import _agreed
    from pagedkv.errors import InsufficientMemoryError

    group = KVCacheGroupSpec(layer_names=("l0",), kv_cache_spec=SPEC)
    mine = KVCacheConfig(num_blocks=10, kv_cache_tensors=(), kv_cache_groups=(group,))
    assert _agreed(mine, None, [(None, "d"), (None, "d")]) is mine
    # the same planner failure everywhere keeps the planner's own exception
    own = InsufficientMemoryError("too small")
    same = "InsufficientMemoryError: too small"
    with pytest.raises(InsufficientMemoryError) as raised:
        _agreed(None, own, [(same, ""), (same, "")])
    assert raised.value is own
    # a failure on some ranks fails every rank, naming them
    with pytest.raises(DistributedPlanningError, match=r"failed on rank 1: PlanningError: x$"):
        _agreed(mine, None, [(None, "d"), ("PlanningError: x", "")])
    mixed = r"rank 0: InsufficientMemoryError.*rank 1: P"
    with pytest.raises(DistributedPlanningError, match=mixed):
        _agreed(None, own, [(same, ""), ("PlanningError: x", "")])
    with pytest.raises(DistributedPlanningError, match=r"different KV caches.*0: a, rank 1: b"):
        _agreed(mine, None, [(None, "a"), (None, "b")])
