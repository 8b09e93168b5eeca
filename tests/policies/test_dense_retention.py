"""Dense retention is an extension: imported by name, only when chosen."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from pagedkv import config as config_module
from pagedkv.errors import ConfigError
from pagedkv.policies import DenseRetention
from pagedkv.runtime import Request
from pagedkv.runtime.managers.base import Retention
from runtime.helpers import full, make_manager, swa


def test_default_retention_is_the_cores_and_leaves_the_extension_unloaded() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r});"
        "from runtime.helpers import full, make_manager, swa;"
        "m = make_manager([full(), swa(8)]);"
        "print(sorted({type(g.retention).__name__ for g in m.managers}),"
        " 'pagedkv.policies' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['Retention']", "False"]


def test_dense_gives_every_group_a_dense_retention() -> None:
    manager = make_manager([full(), swa(8)], retention="dense")
    assert all(type(m.retention) is DenseRetention for m in manager.managers)
    assert [m.retention.dense for m in manager.managers] == [False, True]


class KeepNothing(Retention):
    def blocks_to_cache(self, manager: object, request: object, start: int, end: int) -> set[int]:
        return set()


def test_a_plugin_adds_a_retention_by_qualname(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {**config_module.PREFIX_CACHE_RETENTIONS, "none": f"{__name__}.KeepNothing"}
    monkeypatch.setattr(config_module, "PREFIX_CACHE_RETENTIONS", names)
    monkeypatch.setattr("pagedkv.runtime.kv_cache_manager.PREFIX_CACHE_RETENTIONS", names)
    manager = make_manager([full()], retention="none")
    req = Request("a", list(range(16)))
    assert manager.allocate_slots(req, 16) is not None
    assert all(h is None for h in manager.block_pool.block_hash)
    names["bad"] = "pagedkv.runtime.request.Request"
    with pytest.raises(ConfigError, match="not a Retention"):
        make_manager([full()], retention="bad")


@pytest.mark.parametrize("retention", ["vllm", "dense"])
def test_a_dropped_manager_frees_its_pool_without_the_cycle_collector(retention: str) -> None:
    # A retention holds no reference to its manager: a large pool goes with the manager.
    gc.disable()
    try:
        manager = make_manager([full(), swa(8)], retention=retention)
        manager.allocate_slots(Request("a", list(range(20))), 20)
        pool = weakref.ref(manager.block_pool)
        del manager
        assert pool() is None
    finally:
        gc.enable()
