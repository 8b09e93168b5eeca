"""Registration and lazy start-up registration from many threads at once."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable

import pytest

from pagedkv.errors import RegistryError
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import FullAttentionSpec

from .managers import FullManager, register_test_managers
from .spec_variants import ATTN

NUM_THREADS = 8


def run_together(target: Callable[[int], None]) -> list[BaseException]:
    barrier = threading.Barrier(NUM_THREADS)
    errors: list[BaseException] = []

    def body(index: int) -> None:
        barrier.wait()
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(NUM_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return errors


def make_spec_classes(count: int) -> list[type]:
    return [
        dataclasses.make_dataclass(
            f"ThreadSpec{i}", [], bases=(FullAttentionSpec,), frozen=True, kw_only=True
        )
        for i in range(count)
    ]


@pytest.mark.slow
def test_distinct_and_identical_registrations_from_many_threads(
    empty_registry: type[KVCacheSpecRegistry],
) -> None:
    classes = make_spec_classes(NUM_THREADS * 25)
    managers = [type(f"Manager{i}", (), {}) for i in range(len(classes))]

    def register(index: int) -> None:
        for i in range(index, len(classes), NUM_THREADS):
            empty_registry.register(classes[i], managers[i], FullAttentionSpec)
        # Every thread also re-registers the same shared entries: a no-op.
        for i in range(10):
            empty_registry.register(classes[i], managers[i], FullAttentionSpec)

    assert run_together(register) == []
    specs = empty_registry.registered_specs()
    assert len(specs) == len(classes)
    for cls, manager in zip(classes, managers):
        assert specs[cls].manager_class is manager


def test_conflicting_registrations_from_many_threads_have_one_winner(
    empty_registry: type[KVCacheSpecRegistry],
) -> None:
    (cls,) = make_spec_classes(1)
    managers = [type(f"Candidate{i}", (), {}) for i in range(NUM_THREADS)]
    winners: list[type] = []

    def register(index: int) -> None:
        empty_registry.register(cls, managers[index], FullAttentionSpec)
        winners.append(managers[index])

    errors = run_together(register)
    assert len(winners) == 1
    assert len(errors) == NUM_THREADS - 1
    assert all(isinstance(e, RegistryError) for e in errors)
    assert empty_registry.registered_specs()[cls].manager_class is winners[0]


def test_lazy_start_up_runs_once_and_every_thread_sees_the_builtins(
    empty_registry: type[KVCacheSpecRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    module = types.ModuleType("pagedkv_test_slow_bootstrap")

    def register_all(config: object = None) -> None:
        calls.append(1)
        time.sleep(0.05)  # widen the window in which other threads query
        register_test_managers()

    module.register_all = register_all  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr("pagedkv.registry._BOOTSTRAP_MODULE", module.__name__)
    empty_registry.reset()
    seen: list[object] = []
    spec = FullAttentionSpec(**ATTN)

    errors = run_together(lambda _: seen.append(empty_registry.get_manager_class(spec)))
    assert errors == []
    assert calls == [1]
    assert seen == [FullManager] * NUM_THREADS


DEADLOCK_SCRIPT = """
import sys, threading, time, types
from pagedkv.platforms import get_current_platform
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import FullAttentionSpec

class DetectedSpec(FullAttentionSpec):
    pass

class Manager:
    pass

a_resolving = threading.Event()

def detect():
    a_resolving.set()
    time.sleep(0.2)  # let the other thread enter start-up registration
    KVCacheSpecRegistry.register(DetectedSpec, Manager, FullAttentionSpec)

module = types.ModuleType("pagedkv_test_detect")
module.detect = detect
sys.modules[module.__name__] = module

def register_all(config=None):
    KVCacheSpecRegistry.register(FullAttentionSpec, Manager)
    get_current_platform()

bootstrap = types.ModuleType("pagedkv_test_platform_bootstrap")
bootstrap.register_all = register_all
sys.modules[bootstrap.__name__] = bootstrap
import pagedkv.registry
pagedkv.registry._BOOTSTRAP_MODULE = bootstrap.__name__

def query():
    a_resolving.wait(5)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8)
    KVCacheSpecRegistry.get_manager_class(spec)

threads = [threading.Thread(target=get_current_platform), threading.Thread(target=query)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert DetectedSpec in pagedkv.registry._specs
print("ok")
"""


@pytest.mark.slow
def test_platform_resolution_and_registry_start_up_do_not_deadlock() -> None:
    # Thread A resolves the platform, whose detection code registers a spec; thread
    # B meanwhile triggers start-up registration, which needs the platform. With one
    # lock each for registry and discovery they would wait for each other forever,
    # so this runs in a child process with a timeout.
    env = {**os.environ, "PAGEDKV_PLATFORM": "pagedkv_test_detect.detect"}
    try:
        result = subprocess.run(
            [sys.executable, "-c", DEADLOCK_SCRIPT],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock between platform discovery and registry start-up")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
