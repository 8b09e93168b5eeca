"""Typed, error-naming access to a model config, optionally normalised by transformers.

Published values win; transformers (when installed and it knows the model type)
only fills in fields the JSON leaves implicit, such as derived ``layer_types``.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from pagedkv.errors import ModelConfigError

_MISSING: Any = object()
ENV_TRANSFORMERS = "PAGEDKV_TRANSFORMERS"
# Sizes a config must state: transformers' class defaults for them (32 layers, a
# 32,000 vocabulary) describe some other model, so a plan built on them would be wrong.
MUST_BE_PUBLISHED = frozenset({"num_hidden_layers", "vocab_size", "hidden_size"})
# Layer counts are checked before anything builds per-layer lists.
LAYER_COUNT_KEYS = frozenset(
    {"num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers"}
)
MAX_LAYERS = 10_000


class ConfigView:
    """One (sub-)config: ``get`` reads published values, then normalised ones."""

    def __init__(
        self,
        model: str,
        published: Mapping[str, Any],
        normalized: Mapping[str, Any] | None = None,
        prefix: str = "",
    ) -> None:
        self.model = model
        self.published = published
        self.normalized = normalized or {}
        self.prefix = prefix

    def _missing(self, key: str) -> ModelConfigError:
        return ModelConfigError(f"{self.model}: config field {self.prefix}{key!r} is missing")

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.published.get(key)
        if value is None:
            value = self.normalized.get(key)
        return default if value is None else value

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        """A positive (or ``>= minimum``) integer field; ``default`` when absent."""
        value = self.get(key)
        if value is None:
            if default is _MISSING:
                raise self._missing(key)
            return int(default)
        if default is _MISSING and key in MUST_BE_PUBLISHED and self.published.get(key) is None:
            raise ModelConfigError(
                f"{self.model}: config field {self.prefix}{key!r} is missing (transformers "
                f"would fill in its class default {value!r}, which belongs to another model)"
            )
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
            names = " / ".join(repr(k) for k in keys)
            raise ModelConfigError(f"{self.model}: config field {self.prefix}{names} is missing")
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
        return ConfigView(self.model, published, normalized, f"{self.prefix}{key}.")


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


@contextlib.contextmanager
def quiet(library: str) -> Iterator[None]:
    """Silence a library's log records below ERROR and its warnings (pagedkv reports one
    line of its own instead)."""
    logger = logging.getLogger(library)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


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
