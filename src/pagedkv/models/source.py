"""Finding and reading a model's config.json: a bundled name, a directory or a file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pagedkv.errors import ModelConfigError
from pagedkv.models.hub import (
    INDEX_FILE,
    CheckpointInfo,
    fetch_checkpoint_info,
    fetch_config,
    is_hub_id,
    read_checkpoint_info,
)

MAMBA_SSM_FORMAT = "mamba_ssm"


def bundled_models_dir() -> Path:
    return Path(str(resources.files("pagedkv") / "data" / "models"))


def list_bundled_models() -> list[str]:
    """Names of the model configs shipped with pagedkv, sorted case-insensitively."""
    root = bundled_models_dir()
    names = [p.parent.name for p in root.glob("*/config.json")]
    return sorted(names, key=str.lower)


@dataclass(frozen=True)
class ModelSource:
    """A parsed config.json with where it came from.

    ``text_config`` is the language-model part (the nested ``text_config`` of a
    multimodal wrapper, else the whole config).
    """

    name: str
    raw: dict[str, Any] = field(repr=False, compare=False)
    path: Path | None = None
    checkpoint: CheckpointInfo | None = field(default=None, compare=False)

    @property
    def architecture(self) -> str | None:
        archs = self.raw.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return archs[0]
        return None

    @property
    def model_type(self) -> str | None:
        if "ssm_cfg" in self.raw and "d_model" in self.raw and "model_type" not in self.raw:
            return MAMBA_SSM_FORMAT
        value = self.raw.get("model_type")
        return value if isinstance(value, str) else None

    @property
    def text_config(self) -> dict[str, Any]:
        text = self.raw.get("text_config")
        return text if isinstance(text, dict) else self.raw


def _parse(path: Path, name: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ModelConfigError(
            f"{name}: {path} is not UTF-8 text (byte {exc.start}); a config.json is JSON"
        ) from None
    try:
        # Python's json accepts the Infinity / NaN that published configs contain.
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{name}: {path} is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ModelConfigError(f"{name}: {path} is nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{name}: {path} must hold a JSON object")
    return data


def _find_bundled(name: str) -> Path | None:
    """A bundled config by its exact name (``Llama-3.1-8B``; a Hub id is not bundled)."""
    if name in list_bundled_models():
        return bundled_models_dir() / name / "config.json"
    return None


def _from_directory(path: Path, text: str) -> ModelSource:
    config = path / "config.json"
    if not config.is_file():
        raise ModelConfigError(f"{text}: directory has no config.json")
    index = path / INDEX_FILE
    checkpoint = read_checkpoint_info(index) if index.is_file() else None
    return ModelSource(path.resolve().name, _parse(config, text), config, checkpoint)


def _from_hub(repo_id: str, revision: str | None) -> ModelSource:
    try:
        config = fetch_config(repo_id, revision)
    except ModelConfigError as exc:
        name = repo_id.rsplit("/", 1)[-1]
        if name not in list_bundled_models():
            raise
        raise ModelConfigError(f"{exc}; pagedkv also bundles a copy: pass {name}") from None
    checkpoint = fetch_checkpoint_info(repo_id, revision)
    return ModelSource(repo_id, _parse(config, repo_id), config, checkpoint)


def _not_found(text: str) -> ModelConfigError:
    folded = [n for n in list_bundled_models() if n.lower() == text.strip().lower()]
    hint = f"did you mean the bundled {folded[0]}? " if folded else ""
    known = ", ".join(list_bundled_models())
    return ModelConfigError(
        f"{text}: no such file or directory, and not a bundled model; {hint}give a Hugging "
        f"Face Hub id as org/name (bundled: {known})"
    )


def load_model_config(
    name_or_path: str | Path | ModelSource, *, revision: str | None = None
) -> ModelSource:
    """Read a config: a ModelSource as is, a model directory or file, a bundled model by
    exact name, or a Hugging Face Hub id (``org/name``, at ``revision``) through the Hub's
    cache. Only config.json and the safetensors index are fetched, never weights."""
    if isinstance(name_or_path, ModelSource):
        return name_or_path
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return _from_directory(path, text)
    if path.is_file():
        name = path.parent.name if path.name == "config.json" else path.stem
        return ModelSource(name, _parse(path, text), path)
    bundled = _find_bundled(text)
    if bundled is not None:
        return ModelSource(bundled.parent.name, _parse(bundled, text), bundled)
    if is_hub_id(text):
        return _from_hub(text.strip(), revision)
    raise _not_found(text)
