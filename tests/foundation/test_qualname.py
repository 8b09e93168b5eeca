"""resolve_obj_by_qualname: what it finds, and errors that say what is missing."""

from __future__ import annotations

import os.path
import sys
import types

import pytest

from pagedkv.errors import PlatformError
from pagedkv.platforms import (
    DEFAULT_BUILDER_QUALNAME,
    GenericPlatform,
    qualname_of,
    resolve_obj_by_qualname,
)
from pagedkv.specs import FullAttentionSpec


@pytest.mark.parametrize(
    ("qualname", "expected"),
    [
        ("pagedkv.specs.FullAttentionSpec", FullAttentionSpec),
        ("pagedkv.specs:FullAttentionSpec", FullAttentionSpec),
        ("pagedkv.specs.FullAttentionSpec.kind", "full_attention"),  # nested attribute
        ("pagedkv.specs:FullAttentionSpec.kind", "full_attention"),
        ("  pagedkv.platforms.GenericPlatform ", GenericPlatform),
        ("os.path.join", os.path.join),
    ],
)
def test_resolves(qualname: str, expected: object) -> None:
    assert resolve_obj_by_qualname(qualname) == expected


def test_default_builder_name_resolves() -> None:
    from pagedkv.planning.builder import DefaultKVCacheConfigBuilder

    assert resolve_obj_by_qualname(DEFAULT_BUILDER_QUALNAME) is DefaultKVCacheConfigBuilder


def test_qualname_of_round_trips() -> None:
    assert qualname_of(FullAttentionSpec) == "pagedkv.specs.full.FullAttentionSpec"
    assert resolve_obj_by_qualname(qualname_of(FullAttentionSpec)) is FullAttentionSpec
    assert resolve_obj_by_qualname(qualname_of(resolve_obj_by_qualname)) is (
        resolve_obj_by_qualname
    )


@pytest.mark.parametrize(
    ("qualname", "message"),
    [
        ("no_such_pkg.module.Thing", "module 'no_such_pkg.module' not found"),
        ("pagedkv.specs.NoSuchSpec", "'pagedkv.specs' has no attribute 'NoSuchSpec'"),
        (
            "pagedkv.no_such_module.Thing",
            "'pagedkv' has no attribute 'no_such_module' (and there is no module "
            "'pagedkv.no_such_module')",
        ),
        (
            "pagedkv.specs.FullAttentionSpec.no_such_attr",
            "'pagedkv.specs.FullAttentionSpec' has no attribute 'no_such_attr'",
        ),
        ("pagedkv.specs:NoSuchSpec", "'pagedkv.specs' has no attribute 'NoSuchSpec'"),
        ("no_such_pkg:Thing", "module 'no_such_pkg' not found"),
        ("FullAttentionSpec", "not a qualified name"),
        ("pagedkv..specs", "not a qualified name"),
        (":Thing", "not a qualified name"),
        ("pagedkv.specs:", "not a qualified name"),
        ("", "expected a qualified name"),
        ("   ", "expected a qualified name"),
    ],
)
def test_errors_say_what_is_missing(qualname: str, message: str) -> None:
    with pytest.raises(PlatformError) as info:
        resolve_obj_by_qualname(qualname)
    assert message in str(info.value)
    if qualname.strip():
        assert repr(qualname.strip()) in str(info.value) or "not a qualified" in str(info.value)


def test_non_string_is_an_error() -> None:
    with pytest.raises(PlatformError, match="expected a qualified name"):
        resolve_obj_by_qualname(FullAttentionSpec)  # type: ignore[arg-type]


def test_module_failing_to_import_is_reported_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # A module that exists but whose own import fails must not be mistaken for a
    # missing module (and silently resolved against a shorter prefix).
    package = types.ModuleType("pagedkv_test_pkg")
    package.__path__ = []  # a package
    monkeypatch.setitem(sys.modules, "pagedkv_test_pkg", package)

    class Finder:
        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> object:
            if name == "pagedkv_test_pkg.bad":
                raise ModuleNotFoundError(
                    "No module named 'some_dependency'", name="some_dependency"
                )
            if name == "pagedkv_test_pkg.boom":
                raise RuntimeError("import-time failure")
            return None

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    with pytest.raises(
        PlatformError, match=r"importing module 'pagedkv_test_pkg\.bad' failed.*some_dependency"
    ):
        resolve_obj_by_qualname("pagedkv_test_pkg.bad.Thing")
    with pytest.raises(
        PlatformError, match=r"importing module 'pagedkv_test_pkg\.boom' failed.*RuntimeError"
    ):
        resolve_obj_by_qualname("pagedkv_test_pkg.boom.Thing")
