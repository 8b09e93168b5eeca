"""Platform resolution and plugin loading, through real entry points on sys.path."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import entry_points

import pytest

from pagedkv.config import EngineConfig
from pagedkv.errors import PlatformError
from pagedkv.platforms import (
    DEFAULT_BUILDER_QUALNAME,
    PLATFORM_ENV,
    PLATFORM_GROUP,
    PLUGIN_GROUP,
    PLUGINS_ENV,
    GenericPlatform,
    Platform,
    get_current_platform,
    load_general_plugins,
    set_current_platform,
)
from startup_state import loaded_plugins, reset_plugins

AddPath = Callable[..., None]


def test_generic_platform_without_plugins() -> None:
    assert get_current_platform() is GenericPlatform
    import pagedkv.platforms as platforms

    assert platforms.current_platform is GenericPlatform


def test_platform_defaults() -> None:
    assert Platform.register_custom_kv_cache_specs(None) is None
    assert Platform.get_kv_cache_config_builder_cls(None) == DEFAULT_BUILDER_QUALNAME
    assert Platform.get_kv_cache_config_builder_cls(EngineConfig()) == DEFAULT_BUILDER_QUALNAME
    declared = EngineConfig.create(kv_cache_config_builder="my.pkg.Builder")
    assert Platform.get_kv_cache_config_builder_cls(declared) == "my.pkg.Builder"
    assert Platform.support_hybrid_kv_cache()
    assert Platform.default_kv_cache_layout() == "NHD"
    assert Platform.kv_cache_block_size_multiple(None) == 1


def test_entry_points_are_discovered_from_sys_path(plugin_path: AddPath) -> None:
    assert not [ep for ep in entry_points(group=PLATFORM_GROUP) if ep.name == "test_a"]
    plugin_path("platform_a")
    names = {ep.name for ep in entry_points(group=PLATFORM_GROUP)}
    assert "test_a" in names
    assert "test_a_specs" in {ep.name for ep in entry_points(group=PLUGIN_GROUP)}


def test_single_platform_plugin_is_selected(plugin_path: AddPath) -> None:
    plugin_path("platform_a")
    platform = get_current_platform()
    assert platform.__name__ == "TestPlatformA"
    assert platform.__module__ == "pagedkv_test_platform_a.platform"
    assert not platform.support_hybrid_kv_cache()


def test_platform_plugin_given_as_function_returning_qualname(plugin_path: AddPath) -> None:
    plugin_path("platform_b")
    assert get_current_platform().__name__ == "TestPlatformB"
    assert get_current_platform().default_kv_cache_layout() == "HND"


def test_inactive_plugin_does_not_count(plugin_path: AddPath) -> None:
    plugin_path("inactive")
    assert get_current_platform() is GenericPlatform
    set_current_platform(None)
    plugin_path("platform_b")
    assert get_current_platform().__name__ == "TestPlatformB"  # one active of two installed


def test_platform_is_resolved_once(plugin_path: AddPath) -> None:
    plugin_path("inactive")
    import pagedkv_test_inactive

    get_current_platform()
    get_current_platform()
    assert len(pagedkv_test_inactive.CALLS) == 1
    set_current_platform(None)  # forget: resolve again on next use
    get_current_platform()
    assert len(pagedkv_test_inactive.CALLS) == 2


def test_two_platform_plugins_is_an_error(plugin_path: AddPath) -> None:
    plugin_path("platform_a", "platform_b")
    with pytest.raises(PlatformError) as info:
        get_current_platform()
    message = str(info.value)
    assert "more than one platform plugin" in message
    assert "test_a" in message and "test_b" in message
    assert "TestPlatformA" in message and "TestPlatformB" in message
    assert PLATFORM_ENV in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("test_b", "TestPlatformB"),  # an installed plugin's entry-point name
        ("pagedkv_test_platform_a.platform.TestPlatformA", "TestPlatformA"),  # a qualname
        ("pagedkv_test_platform_a.platform:TestPlatformA", "TestPlatformA"),
        ("generic", "GenericPlatform"),
    ],
)
def test_env_var_overrides_plugins(
    plugin_path: AddPath, monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    plugin_path("platform_a", "platform_b")  # two plugins: an error without the env var
    monkeypatch.setenv(PLATFORM_ENV, value)
    assert get_current_platform().__name__ == expected


def test_env_var_with_a_single_plugin_installed(
    plugin_path: AddPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_path("platform_a")
    monkeypatch.setenv(PLATFORM_ENV, "tests.nowhere.Nothing")
    with pytest.raises(PlatformError) as info:
        get_current_platform()
    assert PLATFORM_ENV in str(info.value)
    assert "tests.nowhere.Nothing" in str(info.value)
    monkeypatch.setenv(PLATFORM_ENV, "pagedkv.platforms.GenericPlatform")
    assert get_current_platform() is GenericPlatform


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no_such_module.Platform", "module 'no_such_module' not found"),
        ("pagedkv.platforms.NoSuchPlatform", "has no attribute 'NoSuchPlatform'"),
        ("pagedkv.config.EngineConfig", "not a pagedkv Platform subclass"),
        ("pagedkv.config.DEFAULT_NOTHING", "has no attribute"),
        ("test_inactive", "not active"),
    ],
)
def test_env_var_that_does_not_resolve_is_a_clear_error(
    plugin_path: AddPath, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    plugin_path("inactive")
    monkeypatch.setenv(PLATFORM_ENV, value)
    with pytest.raises(PlatformError, match=message) as info:
        get_current_platform()
    assert PLATFORM_ENV in str(info.value)


def test_env_var_naming_a_non_class_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLATFORM_ENV, "pagedkv.platforms.PLATFORM_GROUP")
    with pytest.raises(PlatformError, match="expected a Platform class"):
        get_current_platform()


def test_broken_platform_plugin_names_the_entry_point(plugin_path: AddPath) -> None:
    plugin_path("broken")
    with pytest.raises(PlatformError) as info:
        get_current_platform()
    assert "test_broken" in str(info.value)
    assert "pagedkv_test_broken_missing" in str(info.value)


def test_set_current_platform_forces_one() -> None:
    class Forced(Platform):
        name = "forced"

    set_current_platform(Forced)
    assert get_current_platform() is Forced


def test_general_plugins_load_once(plugin_path: AddPath) -> None:
    plugin_path("general")
    import pagedkv_test_general

    assert load_general_plugins() == ["test_general"]
    assert load_general_plugins() == []
    assert pagedkv_test_general.CALLS == [1]
    assert loaded_plugins() == ["test_general=pagedkv_test_general:register"]
    reset_plugins()
    assert load_general_plugins() == ["test_general"]
    assert len(pagedkv_test_general.CALLS) == 2


def test_failing_plugin_is_named_the_same_way_every_time(plugin_path: AddPath) -> None:
    plugin_path("failing", "general")
    import pagedkv_test_general

    messages = []
    for _ in range(3):
        with pytest.raises(PlatformError) as info:
            load_general_plugins()
        messages.append(str(info.value))
    assert len(set(messages)) == 1
    assert "test_failing" in messages[0] and "device library is missing" in messages[0]
    assert "\n" not in messages[0]
    # The others still load, once; the failed one is not called again.
    assert pagedkv_test_general.CALLS == [1]


def test_failing_plugin_fails_every_registry_start_up(plugin_path: AddPath) -> None:
    from pagedkv.registry import KVCacheSpecRegistry
    from pagedkv.specs import FullAttentionSpec
    from startup_state import isolated, reset

    plugin_path("failing")
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8)
    with isolated(builtins=False):
        reset()
        for _ in range(2):
            with pytest.raises(PlatformError, match="test_failing"):
                KVCacheSpecRegistry.get_manager_class(spec)


@pytest.mark.parametrize(
    ("allowed", "expected"),
    [(None, ["test_general"]), ("test_general", ["test_general"]), ("", []),
     (" other , test_general ", ["test_general"]), ("other", [])],
)  # fmt: skip
def test_plugin_allow_list(
    plugin_path: AddPath,
    monkeypatch: pytest.MonkeyPatch,
    allowed: str | None,
    expected: list[str],
) -> None:
    plugin_path("general")
    if allowed is not None:
        monkeypatch.setenv(PLUGINS_ENV, allowed)
    assert load_general_plugins() == expected


def test_allow_list_skips_a_failing_plugin(
    plugin_path: AddPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_path("failing", "general")
    monkeypatch.setenv(PLUGINS_ENV, "test_general")
    assert load_general_plugins() == ["test_general"]


def test_allow_list_applies_to_platform_plugins(
    plugin_path: AddPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_path("platform_a", "platform_b")
    with pytest.raises(PlatformError, match="more than one platform plugin"):
        get_current_platform()
    set_current_platform(None)
    monkeypatch.setenv(PLUGINS_ENV, "test_a")
    assert get_current_platform().__name__ == "TestPlatformA"
    set_current_platform(None)
    monkeypatch.setenv(PLUGINS_ENV, "")
    assert get_current_platform() is GenericPlatform


def test_broken_general_plugin_names_the_entry_point(plugin_path: AddPath) -> None:
    plugin_path("broken")
    with pytest.raises(PlatformError, match=r"test_broken_plugin.*pagedkv\.plugins"):
        load_general_plugins()


def test_plugin_path_fixture_leaves_no_modules_behind() -> None:
    assert not [name for name in sys.modules if name.startswith("pagedkv_test_")]
