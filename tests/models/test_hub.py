"""Models by Hugging Face Hub id, read from a local Hub cache (no network)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pagedkv.errors import ModelConfigError
from pagedkv.models import describe_model, estimate_weight_bytes, load_model_config
from pagedkv.models.hub import is_hub_id

from .hub_cache import add_repo, offline_cache

pytest.importorskip("huggingface_hub")

LLAMA = load_model_config("Llama-3.1-8B").raw
INDEX = {"metadata": {"total_parameters": 8_030_261_248, "total_size": 16_060_522_496}}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return offline_cache(tmp_path, monkeypatch)


def test_hub_id_is_read_from_the_cache(cache: Path) -> None:
    add_repo(cache, "meta-llama/Llama-3.1-8B", {"config.json": LLAMA})
    source = load_model_config("meta-llama/Llama-3.1-8B")
    assert source.name == "meta-llama/Llama-3.1-8B" and source.raw == LLAMA
    assert source.checkpoint is None  # no index in this snapshot
    layout = describe_model("meta-llama/Llama-3.1-8B")
    assert layout.num_params == layout.config_params


def test_safetensors_index_gives_params_and_weight_bytes(cache: Path) -> None:
    add_repo(
        cache, "acme/llama-copy", {"config.json": LLAMA, "model.safetensors.index.json": INDEX}
    )
    layout = describe_model("acme/llama-copy")
    assert layout.num_params == 8_030_261_248 != layout.config_params
    assert estimate_weight_bytes(layout) == 16_060_522_496
    assert estimate_weight_bytes(layout, 2) == 16_060_522_496 // 2


def test_params_from_the_index_size_when_it_states_no_count(cache: Path) -> None:
    size_only = {"metadata": {"total_size": 16_060_522_496}}
    add_repo(cache, "acme/bf16", {"config.json": LLAMA, "model.safetensors.index.json": size_only})
    assert describe_model("acme/bf16").num_params == 16_060_522_496 // 2  # bfloat16
    quantized = {**LLAMA, "quantization_config": {"quant_method": "fp8"}}
    add_repo(
        cache, "acme/fp8", {"config.json": quantized, "model.safetensors.index.json": size_only}
    )
    layout = describe_model("acme/fp8")
    assert layout.num_params == layout.config_params  # bytes per parameter unknown
    assert estimate_weight_bytes(layout) == 16_060_522_496


def test_revision_picks_a_snapshot(cache: Path) -> None:
    add_repo(cache, "acme/model", {"config.json": LLAMA})
    other = {**LLAMA, "num_hidden_layers": 16}
    add_repo(cache, "acme/model", {"config.json": other}, commit="f" * 40, ref="v2")
    assert load_model_config("acme/model").raw["num_hidden_layers"] == 32
    assert load_model_config("acme/model", revision="v2").raw["num_hidden_layers"] == 16
    assert load_model_config("acme/model", revision="f" * 40).raw["num_hidden_layers"] == 16


def test_offline_and_not_cached_says_what_to_do(cache: Path) -> None:
    with pytest.raises(ModelConfigError) as info:
        load_model_config("acme/not-cached")
    message = str(info.value)
    assert "\n" not in message and "HF_HUB_OFFLINE is set" in message
    assert "not in the Hugging Face cache" in message


def test_unknown_revision_offline(cache: Path) -> None:
    add_repo(cache, "acme/model", {"config.json": LLAMA})
    with pytest.raises(ModelConfigError, match="at revision 'nope'"):
        load_model_config("acme/model", revision="nope")


def test_no_network_is_one_line_and_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offline_cache(tmp_path, monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ModelConfigError) as info:
        load_model_config("acme/unreachable")
    message = str(info.value)
    assert "\n" not in message and "cannot reach the Hugging Face Hub" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_bundled_names_are_exact(cache: Path) -> None:
    with pytest.raises(ModelConfigError) as info:
        load_model_config("llama-3.1-8b")
    assert "did you mean the bundled Llama-3.1-8B" in str(info.value)
    # An org/name id is never silently replaced by the bundled copy of its last part,
    # but the error says the copy is there.
    with pytest.raises(ModelConfigError) as info:
        load_model_config("someone-else/Llama-3.1-8B")
    assert "not in the Hugging Face cache" in str(info.value)
    assert str(info.value).endswith("pagedkv also bundles a copy: pass Llama-3.1-8B")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        *[("meta-llama/Llama-3.1-8B", True), ("Qwen/Qwen3-8B", True), ("gpt2", False)],
        *[("a/b/c", False), ("/abs/path", False), ("org/", False)],
    ],
)
def test_is_hub_id(text: str, expected: bool) -> None:
    assert is_hub_id(text) is expected


def _raising(exc: Exception) -> Callable[..., Path]:
    def download(repo_id: str, filename: str, settings: dict[str, Any]) -> Path:
        raise exc

    return download


def _hub_error(name: str) -> Exception:
    """One of huggingface_hub's errors, without the HTTP response its constructor wants."""
    from huggingface_hub import errors

    cls = getattr(errors, name)
    exc = cls.__new__(cls)
    Exception.__init__(exc, "boom")
    return exc


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("GatedRepoError", "is gated on the Hugging Face Hub: accept its licence"),
        ("RepositoryNotFoundError", "is not on the Hugging Face Hub (or is private"),
    ],
)
def test_gated_and_missing_repos(
    cache: Path, monkeypatch: pytest.MonkeyPatch, error: str, message: str
) -> None:
    from pagedkv.models import hub

    monkeypatch.setattr(hub, "_download", _raising(_hub_error(error)))
    with pytest.raises(ModelConfigError) as info:
        load_model_config("acme/secret")
    assert message in str(info.value) and "\n" not in str(info.value)
