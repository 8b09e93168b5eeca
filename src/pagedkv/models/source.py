"""A model's config.json: finding and reading it, and typed access to its fields.

Found as a bundled name, a directory, a file or a Hub id. Published values win;
transformers (when installed and it knows the model type) only fills in fields the
JSON leaves implicit, such as derived ``layer_types``.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Mapping
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
    quiet,
    read_checkpoint_info,
)

__all__ = [
    "MAMBA_SSM_FORMAT",
    "bundled_models_dir",
    "list_bundled_models",
    "ModelSource",
    "ModelLike",
    "load_model_config",
    "ENV_TRANSFORMERS",
    "LAYER_COUNT_KEYS",
    "MAX_LAYERS",
    "ConfigView",
    "transformers_mode",
    "normalize_with_transformers",
]

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


# What load_model_config reads: a bundled name, a directory, a file, a Hub id, or a parsed config.
ModelLike = str | Path | ModelSource


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


def load_model_config(name_or_path: ModelLike, *, revision: str | None = None) -> ModelSource:
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


_MISSING: Any = object()
ENV_TRANSFORMERS = "PAGEDKV_TRANSFORMERS"
# Layer counts are checked before anything builds per-layer lists.
LAYER_COUNT_KEYS = frozenset(
    {"num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers"}
)
MAX_LAYERS = 10_000


class ConfigView:
    """One (sub-)config as its config class reads it.

    ``get`` reads, in order: the published value (an explicit ``null`` included, except
    where transformers' completion fills it), transformers' completion of the file
    (``normalized``, when it was used), then the class ``defaults`` of the config's
    model type. Every field read that the file left out is recorded in ``filled``
    (shared with sub-views), so a plan can say which values came from defaults.
    ``origin`` names the file in errors.

    Args:
        model: the model's name, for errors.
        published: the config file's (sub-)section as published.
        normalized: transformers' completion of it (None: not used).
        prefix: the section's path in the file (e.g. ``"text_config."``), for messages.
        defaults: the config class's defaults for the model type (None: none).
        origin: the file's name, for errors (None: unnamed).
        filled: the shared record of fields read from defaults (None: a new one).
    """

    def __init__(
        self,
        model: str,
        published: Mapping[str, Any],
        normalized: Mapping[str, Any] | None = None,
        prefix: str = "",
        *,
        defaults: Mapping[str, Any] | None = None,
        origin: str | None = None,
        filled: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.published = published
        self.normalized = normalized or {}
        self.defaults = defaults or {}
        self.prefix = prefix
        self.origin = origin
        self.filled: dict[str, Any] = {} if filled is None else filled
        # A published null overrides a class default (``"sliding_window": null`` is no window).
        values = {k: v for k, v in self.defaults.items() if k not in published}
        values.update({k: v for k, v in self.normalized.items() if v is not None})
        values.update({k: v for k, v in published.items() if v is not None})
        self._values = values

    def _missing(self, key: str) -> ModelConfigError:
        where = f" in {self.origin}" if self.origin else ""
        why = "" if self.defaults else " and its model type has no known class defaults"
        return ModelConfigError(
            f"{self.model}: config field {self.prefix}{key!r} is missing{where}{why}"
        )

    def _value(self, key: str) -> Any:
        value = self._values.get(key)
        if value is not None and key not in self.published:
            self.filled[f"{self.prefix}{key}"] = value
        return value

    def has(self, key: str) -> bool:
        return self._value(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self._value(key)
        return default if value is None else value

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        """A positive (or ``>= minimum``) integer field; ``default`` when absent."""
        value = self._value(key)
        if value is None:
            if default is _MISSING:
                raise self._missing(key)
            return int(default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ModelConfigError(
                f"{self.model}: config field {self.prefix}{key!r} must be an integer >= "
                f"{minimum}, got {value!r}"
            )
        if key in LAYER_COUNT_KEYS and value > MAX_LAYERS:
            raise ModelConfigError(
                f"{self.model}: config field {self.prefix}{key!r} is {value:,}; more than "
                f"{MAX_LAYERS:,} layers is not a real model"
            )
        return value

    def first_int(self, *keys: str, default: Any = _MISSING) -> builtins.int:
        """The first of ``keys`` that is set (so aliases can be listed)."""
        for key in keys:
            if self.has(key):
                return self.int(key)
        if default is _MISSING:
            raise self._missing(" / ".join(keys))
        return int(default)

    def list(self, key: str) -> list[Any] | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ModelConfigError(
                f"{self.model}: config field {self.prefix}{key!r} must be a list, got {value!r}"
            )
        return value

    def sub(self, key: str) -> ConfigView:
        """A nested dict field as its own view (empty if absent)."""
        published = self.published.get(key) or {}
        normalized = self.normalized.get(key) or {}
        if not isinstance(published, Mapping) or not isinstance(normalized, Mapping):
            raise ModelConfigError(f"{self.model}: config field {self.prefix}{key!r} is not a dict")
        return ConfigView(
            self.model,
            published,
            normalized,
            f"{self.prefix}{key}.",
            origin=self.origin,
            filled=self.filled,
        )


def transformers_mode(use_transformers: bool | None) -> bool | None:
    """True: required; False: never; None: when installed (env PAGEDKV_TRANSFORMERS=0/1 decides)."""
    if use_transformers is not None:
        return use_transformers
    env = os.environ.get(ENV_TRANSFORMERS, "auto").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    return None


def normalize_with_transformers(
    model: str, raw: Mapping[str, Any], use_transformers: bool | None
) -> tuple[dict[str, Any] | None, str | None]:
    """The text config as transformers' config class completes it, and that class's name.

    (None, None) when transformers is absent or does not know the model type; a
    config transformers rejects falls back to the published JSON.
    """
    mode = transformers_mode(use_transformers)
    if mode is False:
        return None, None
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        if mode:
            raise ModelConfigError(
                f"{model}: transformers was requested but is not installed "
                "(pip install 'pagedkv[hf]')"
            ) from None
        return None, None
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None, None
    try:
        with quiet("transformers"):
            config = CONFIG_MAPPING[model_type](**raw)
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            return dict(text.to_dict()), type(text).__name__
    except Exception:  # transformers validation differs by version; the JSON still works
        return None, None
