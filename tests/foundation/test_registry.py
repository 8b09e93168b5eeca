"""The spec registry with its own manager classes (reference edge cases 41-46)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from pagedkv.errors import RegistryError
from pagedkv.registry import KVCacheSpecMetadata, KVCacheSpecRegistry, register_kv_cache_spec
from pagedkv.specs import (
    AttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from .managers import FullManager, RoleManager, SinkManager, SlidingManager
from .spec_variants import ATTN

FULL = FullAttentionSpec(**ATTN)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CustomFullSpec(FullAttentionSpec):
    """An out-of-tree kind that groups with full attention."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CustomChildSpec(CustomFullSpec):
    """Never registered itself."""


class CustomManager:
    pass


def test_register_and_look_up(registry: type[KVCacheSpecRegistry]) -> None:
    assert registry.get_manager_class(FULL) is FullManager
    assert registry.get_uniform_type_base_spec(FULL) is FullAttentionSpec
    mla = MLAAttentionSpec(block_size=16, head_size=576)
    assert registry.get_manager_class(mla) is FullManager
    assert registry.get_uniform_type_base_spec(mla) is FullAttentionSpec
    meta = registry.get_metadata(mla)
    assert meta == KVCacheSpecMetadata(MLAAttentionSpec, FullManager, FullAttentionSpec)


def test_base_defaults_to_the_class_itself(empty_registry: type[KVCacheSpecRegistry]) -> None:
    empty_registry.register(CustomFullSpec, CustomManager)
    assert empty_registry.get_uniform_type_base_spec(CustomFullSpec(**ATTN)) is CustomFullSpec


def test_identical_reregistration_is_a_noop(registry: type[KVCacheSpecRegistry]) -> None:
    # Edge 41, first half.
    before = registry.registered_specs()
    registry.register(FullAttentionSpec, FullManager, FullAttentionSpec)
    registry.register(FullAttentionSpec, FullManager)  # base defaults to itself: same
    assert registry.registered_specs() == before


@pytest.mark.parametrize(
    ("manager", "base"),
    [(SlidingManager, FullAttentionSpec), (FullManager, AttentionSpec)],
    ids=["other-manager", "other-base"],
)
def test_conflicting_registration_is_an_error(
    registry: type[KVCacheSpecRegistry], manager: type, base: type
) -> None:
    # Edge 41, second half: an error, not an assert, naming both registrations.
    with pytest.raises(RegistryError) as info:
        registry.register(FullAttentionSpec, manager, base)
    message = str(info.value)
    assert "conflicting registration" in message
    assert "FullAttentionSpec" in message
    assert manager.__name__ in message
    assert registry.get_manager_class(FULL) is FullManager  # unchanged


def test_base_must_be_a_superclass(empty_registry: type[KVCacheSpecRegistry]) -> None:
    # Edge 42.
    with pytest.raises(RegistryError, match=r"CustomFullSpec must inherit.*SlidingWindowSpec"):
        empty_registry.register(CustomFullSpec, CustomManager, SlidingWindowSpec)
    with pytest.raises(RegistryError, match="must inherit"):
        empty_registry.register(FullAttentionSpec, FullManager, CustomFullSpec)
    assert empty_registry.registered_specs() == {}


@pytest.mark.parametrize(
    ("spec_cls", "manager", "message"),
    [
        (CustomFullSpec, None, "manager_class is required"),
        (CustomFullSpec, "FullManager", "must be a class"),
        (FULL, FullManager, "expected a spec class"),
    ],
)
def test_invalid_registrations(
    empty_registry: type[KVCacheSpecRegistry], spec_cls: object, manager: object, message: str
) -> None:
    with pytest.raises(RegistryError, match=message):
        empty_registry.register(spec_cls, manager)  # type: ignore[arg-type]


def test_unregistered_subclass_uses_nearest_registered_ancestor(
    registry: type[KVCacheSpecRegistry],
) -> None:
    # Edge 43.
    child = CustomChildSpec(**ATTN)
    assert registry.get_manager_class(child) is FullManager
    assert registry.get_uniform_type_base_spec(child) is FullAttentionSpec
    registry.register(CustomFullSpec, CustomManager, FullAttentionSpec)
    assert registry.get_manager_class(child) is CustomManager  # nearer ancestor now
    assert registry.get_uniform_type_base_spec(child) is FullAttentionSpec
    registry.check_kv_cache_spec_registry({"layer.0": child})


def test_role_manager_takes_precedence(registry: type[KVCacheSpecRegistry]) -> None:
    # Edge 44.
    registry.register_role_manager("hisparse_source", RoleManager)
    assert registry.get_manager_class(FULL, role="hisparse_source") is RoleManager
    assert registry.get_manager_class(FULL, role="default") is FullManager
    assert registry.get_manager_class(FULL) is FullManager
    # Even a spec with no registered class gets the role's manager.
    assert registry.get_manager_class(AttentionSpec(**ATTN), role="hisparse_source") is RoleManager
    assert registry.registered_roles() == {"hisparse_source": RoleManager}


def test_role_registration_rules(registry: type[KVCacheSpecRegistry]) -> None:
    registry.register_role_manager("r", RoleManager)
    registry.register_role_manager("r", RoleManager)  # identical: no-op
    with pytest.raises(RegistryError, match="conflicting manager registration for group role 'r'"):
        registry.register_role_manager("r", FullManager)
    with pytest.raises(RegistryError, match="non-empty string"):
        registry.register_role_manager("", RoleManager)
    with pytest.raises(RegistryError, match="must be a class"):
        registry.register_role_manager("s", RoleManager())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec",
    [
        EncoderOnlyAttentionSpec(**ATTN),
        AttentionSpec(**ATTN),
        UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"x": FULL}),
    ],
    ids=lambda s: type(s).__name__,
)
def test_check_rejects_unregistered_naming_layer_and_type(
    registry: type[KVCacheSpecRegistry], spec: object
) -> None:
    # Edge 46: a ValueError (RegistryError) naming the layer and the spec type.
    specs = {"model.layers.0.attn": FULL, "model.layers.1.attn": spec}
    with pytest.raises(RegistryError) as info:
        registry.check_kv_cache_spec_registry(specs)
    message = str(info.value)
    assert "'model.layers.1.attn'" in message
    assert type(spec).__name__ in message
    assert "register_kv_cache_spec" in message
    assert isinstance(info.value, ValueError)
    assert registry.get_manager_class(spec) is None
    assert registry.get_uniform_type_base_spec(spec) is None


def test_check_accepts_registered_layers(registry: type[KVCacheSpecRegistry]) -> None:
    registry.check_kv_cache_spec_registry(
        {"a": FULL, "b": SinkFullAttentionSpec(**ATTN, sink_len=16), "c": CustomChildSpec(**ATTN)}
    )
    registry.check_kv_cache_spec_registry({})


def test_decorator_registers_and_returns_the_class(
    empty_registry: type[KVCacheSpecRegistry],
) -> None:
    @register_kv_cache_spec(manager_class=SinkManager, uniform_type_base_spec=FullAttentionSpec)
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class DecoratedSpec(FullAttentionSpec):
        pass

    assert isinstance(DecoratedSpec, type)
    assert DecoratedSpec(**ATTN).page_size_bytes == FULL.page_size_bytes
    assert empty_registry.get_manager_class(DecoratedSpec(**ATTN)) is SinkManager
    with pytest.raises(RegistryError, match="manager_class is required"):
        register_kv_cache_spec()(CustomFullSpec)


def test_snapshot_and_restore(registry: type[KVCacheSpecRegistry]) -> None:
    saved = registry.snapshot()
    registry.register(CustomFullSpec, CustomManager, FullAttentionSpec)
    registry.register_role_manager("extra", RoleManager)
    assert CustomFullSpec in registry.registered_specs()
    registry.restore(saved)
    assert CustomFullSpec not in registry.registered_specs()
    assert "extra" not in registry.registered_roles()
    assert registry.get_manager_class(FULL) is FullManager
    # The snapshot is a copy: later registrations do not leak into it.
    registry.register(CustomFullSpec, CustomManager, FullAttentionSpec)
    assert CustomFullSpec not in saved.specs


def test_isolated_restores_on_exit_and_on_error(registry: type[KVCacheSpecRegistry]) -> None:
    with pytest.raises(RuntimeError), registry.isolated(builtins=False):
        assert registry.registered_specs() == {}
        registry.register(CustomFullSpec, CustomManager)
        raise RuntimeError("boom")
    assert CustomFullSpec not in registry.registered_specs()
    assert registry.get_manager_class(FULL) is FullManager


def fake_bootstrap(monkeypatch: pytest.MonkeyPatch, calls: list[object]) -> None:
    """Route lazy start-up registration to a module registering the test managers."""
    from .managers import register_test_managers

    module = types.ModuleType("pagedkv_test_fake_bootstrap")

    def register_all(config: object = None) -> None:
        calls.append(config)
        register_test_managers()

    module.register_all = register_all  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr("pagedkv.registry._BOOTSTRAP_MODULE", module.__name__)


def test_custom_spec_registered_first_does_not_suppress_builtins(
    empty_registry: type[KVCacheSpecRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Edge 45, fixed: vLLM skips the built-ins once any spec is registered; pagedkv
    # tracks them with their own flag.
    calls: list[object] = []
    fake_bootstrap(monkeypatch, calls)
    empty_registry.reset()
    assert not empty_registry.builtins_registered()
    empty_registry.register(CustomFullSpec, CustomManager, FullAttentionSpec)  # first
    assert calls == []  # registering does not bootstrap
    assert empty_registry.get_manager_class(FULL) is FullManager
    assert empty_registry.get_manager_class(CustomFullSpec(**ATTN)) is CustomManager
    assert empty_registry.builtins_registered()
    assert calls == [None]
    empty_registry.get_manager_class(FULL)
    empty_registry.check_kv_cache_spec_registry({"a": FULL})
    empty_registry.ensure_registered("ignored: already done")
    assert calls == [None]  # once


def test_every_query_triggers_start_up_registration(
    empty_registry: type[KVCacheSpecRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    queries = [
        lambda r: r.get_manager_class(FULL),
        lambda r: r.get_uniform_type_base_spec(FULL),
        lambda r: r.get_metadata(FULL),
        lambda r: r.check_kv_cache_spec_registry({"a": FULL}),
        lambda r: r.registered_specs(),
        lambda r: r.registered_roles(),
        lambda r: r.ensure_registered(),
    ]
    for query in queries:
        calls: list[object] = []
        fake_bootstrap(monkeypatch, calls)
        empty_registry.reset()
        query(empty_registry)
        assert len(calls) == 1
        assert FullAttentionSpec in empty_registry.snapshot().specs


def test_ensure_registered_passes_the_config(
    empty_registry: type[KVCacheSpecRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    fake_bootstrap(monkeypatch, calls)
    empty_registry.reset()
    empty_registry.ensure_registered("the config")
    assert calls == ["the config"]


def test_failed_start_up_is_retried(
    empty_registry: type[KVCacheSpecRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []
    module = types.ModuleType("pagedkv_test_failing_bootstrap")

    def register_all(config: object = None) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("platform hook failed")
        from .managers import register_test_managers

        register_test_managers()

    module.register_all = register_all  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr("pagedkv.registry._BOOTSTRAP_MODULE", module.__name__)
    empty_registry.reset()
    with pytest.raises(RuntimeError, match="platform hook failed"):
        empty_registry.get_manager_class(FULL)
    assert not empty_registry.builtins_registered()
    assert empty_registry.get_manager_class(FULL) is FullManager
    assert len(attempts) == 2


def test_queries_during_start_up_do_not_recurse(
    empty_registry: type[KVCacheSpecRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A platform hook may query the registry while start-up registration runs.
    seen: list[object] = []
    module = types.ModuleType("pagedkv_test_reentrant_bootstrap")

    def register_all(config: object = None) -> None:
        from .managers import register_test_managers

        register_test_managers()
        seen.append(KVCacheSpecRegistry.get_manager_class(FULL))

    module.register_all = register_all  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr("pagedkv.registry._BOOTSTRAP_MODULE", module.__name__)
    empty_registry.reset()
    assert empty_registry.get_manager_class(FULL) is FullManager
    assert seen == [FullManager]
