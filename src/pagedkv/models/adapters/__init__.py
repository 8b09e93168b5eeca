"""Model adapters: the interface, which adapter reads which config, and describing a model.

One module per architecture family (``dense``, ``mla``, ``deepseek_v4``, ``hybrid``,
``encdec``, ``mamba_ssm``). The table below says which class reads which architecture or
model_type, so a lookup imports only the one family module it needs. Plugins add
adapters with ``register_model_adapter``.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

from pagedkv.errors import ModelConfigError, RegistryError
from pagedkv.models.class_defaults import ClassDefaults, class_defaults, text_model_type
from pagedkv.models.layers import ModelLayout
from pagedkv.models.source import (
    MAMBA_SSM_FORMAT,
    ConfigView,
    ModelLike,
    ModelSource,
    bundled_models_dir,
    load_model_config,
    normalize_with_transformers,
    transformers_mode,
)

__all__ = [
    "ABC",
    "abstractmethod",
    "Callable",
    "Any",
    "TypeVar",
    "ModelConfigError",
    "RegistryError",
    "ClassDefaults",
    "class_defaults",
    "text_model_type",
    "ModelLayout",
    "MAMBA_SSM_FORMAT",
    "ConfigView",
    "ModelLike",
    "ModelSource",
    "bundled_models_dir",
    "load_model_config",
    "normalize_with_transformers",
    "transformers_mode",
    "ModelAdapter",
    "A",
    "BUILTIN_ADAPTERS",
    "register_model_adapter",
    "unregister_model_adapter",
    "registered_adapter_names",
    "find_adapter",
    "describe_model",
]


class ModelAdapter(ABC):
    """Reads one architecture family's config into a ModelLayout.

    ``view`` is the text config (published values first, transformers' normalised
    ones filling gaps); ``source`` gives the whole file (for wrapper-level fields).
    """

    @abstractmethod
    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        """The model's cache layers and parameter counts."""


A = TypeVar("A", bound="type[ModelAdapter]")

# Built-in adapters ("module.Class" in this package) and the architectures and
# model types each reads.
BUILTIN_ADAPTERS: dict[str, tuple[str, ...]] = {
    "dense.DecoderAdapter": (
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Phi3ForCausalLM",
        "GlmForCausalLM",
        "Glm4ForCausalLM",
        "Glm4MoeForCausalLM",
        # vLLM's MiniMax-M2 gives every layer plain attention (attn_type_list is not read).
        "MiniMaxM2ForCausalLM",
        "llama",
        "mistral",
        "mixtral",
        "phi3",
        "glm",
        "glm4",
        "glm4_moe",
        "minimax_m2",
    ),
    "dense.QwenAdapter": (
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
    ),
    "dense.Gemma2Adapter": ("Gemma2ForCausalLM", "gemma2"),
    "dense.Gemma3Adapter": (
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "gemma3",
        "gemma3_text",
    ),
    "dense.Cohere2Adapter": ("Cohere2ForCausalLM", "cohere2"),
    "dense.GptOssAdapter": ("GptOssForCausalLM", "gpt_oss"),
    "dense.Llama4Adapter": (
        "Llama4ForConditionalGeneration",
        "Llama4ForCausalLM",
        "llama4",
        "llama4_text",
    ),
    "dense.Gemma4Adapter": (
        "Gemma4ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "gemma4",
        "gemma4_text",
    ),
    "mla.MLAAdapter": (
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiK2ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "deepseek_v2",
        "deepseek_v3",
        "kimi_k2",
        "glm_moe_dsa",
    ),
    "deepseek_v4.DeepseekV4Adapter": ("DeepseekV4ForCausalLM", "deepseek_v4"),
    "hybrid.JambaAdapter": ("JambaForCausalLM", "jamba"),
    "hybrid.NemotronHAdapter": ("NemotronHForCausalLM", "nemotron_h"),
    "hybrid.GraniteHybridAdapter": ("GraniteMoeHybridForCausalLM", "granitemoehybrid"),
    "hybrid.GatedDeltaNetAdapter": (
        "Qwen3NextForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_5_text",
        "qwen3_5_moe_text",
    ),
    "hybrid.Mamba2Adapter": ("Mamba2ForCausalLM", "mamba2"),
    "encdec.T5Adapter": ("T5ForConditionalGeneration", "t5"),
    "encdec.BartAdapter": (
        "BartForConditionalGeneration",
        "BartModel",
        "MBartForConditionalGeneration",
        "bart",
        "mbart",
    ),
    "encdec.WhisperAdapter": ("WhisperForConditionalGeneration", "whisper"),
    "mamba_ssm.MambaSSMAdapter": (MAMBA_SSM_FORMAT,),
}

_lock = threading.RLock()
# name -> "module.Class" of a built-in not imported yet (unregistering a name drops it).
_builtin: dict[str, str] = {n: where for where, names in BUILTIN_ADAPTERS.items() for n in names}
# name -> adapter class: registered ones, and built-ins once imported.
_adapters: dict[str, type[ModelAdapter]] = {}


def _import_builtin(where: str) -> type[ModelAdapter]:
    module, name = where.split(".")
    cls: type[ModelAdapter] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return cls


def _adapter_class(name: str) -> type[ModelAdapter] | None:
    with _lock:
        cls = _adapters.get(name)
        if cls is None and name in _builtin:
            cls = _adapters[name] = _import_builtin(_builtin[name])
        return cls


def register_model_adapter(*names: str, override: bool = False) -> Callable[[A], A]:
    """Class decorator: the adapter for configs whose architecture or model_type is in ``names``.

    Registering a name twice with a different class raises unless ``override``.
    """
    if not names:
        raise RegistryError("register_model_adapter needs at least one architecture name")

    def decorate(cls: A) -> A:
        if not (isinstance(cls, type) and issubclass(cls, ModelAdapter)):
            raise RegistryError(f"{cls!r} is not a ModelAdapter subclass")
        with _lock:
            for name in names:
                current = _registered_other_than(name, cls)
                if current is not None and not override:
                    raise RegistryError(
                        f"model adapter for {name!r} is already {current}; "
                        "pass override=True to replace it"
                    )
            for name in names:
                _adapters[name] = cls
        return cls

    return decorate


def _registered_other_than(name: str, cls: type[ModelAdapter]) -> str | None:
    """The qualname of another class registered for ``name`` (a built-in is not imported)."""
    current = _adapters.get(name)
    if current is not None:
        return None if current is cls else current.__qualname__
    where = _builtin.get(name)
    if where is None or f"{cls.__module__}.{cls.__qualname__}" == f"{__name__}.{where}":
        return None
    return where.split(".")[1]


def unregister_model_adapter(name: str) -> None:
    """Remove one name's registration (tests and plugins that replace one)."""
    with _lock:
        _adapters.pop(name, None)
        _builtin.pop(name, None)


def registered_adapter_names() -> list[str]:
    """Every name an adapter is registered for (this imports every built-in family)."""
    with _lock:
        for name in list(_builtin):
            _adapter_class(name)
        return sorted(_adapters)


def find_adapter(source: ModelSource) -> ModelAdapter:
    """The adapter for the config's first architecture, else its model_type."""
    keys: list[Any] = [source.architecture, source.model_type]
    keys.append(source.text_config.get("model_type"))
    for key in keys:
        cls = _adapter_class(key) if isinstance(key, str) else None
        if cls is not None:
            return cls()
    if source.model_type or source.text_config.get("model_type"):
        # no family adapter: the generic attention-decoder reading, which refuses what it
        # cannot size by name
        return _import_builtin("generic.GenericDecoderAdapter")()
    label = source.architecture or source.model_type or "none given"
    raise ModelConfigError(
        f"{source.name}: unknown architecture {label!r} (field 'architectures' / 'model_type'); "
        "register an adapter with pagedkv.models.register_model_adapter"
    )


def describe_model(model: ModelLike, *, use_transformers: bool | None = None) -> ModelLayout:
    """Read a config (bundled name, directory, file or ModelSource) into a ModelLayout.

    Fields the file leaves out take the class defaults of its model type, as
    transformers reads it; the layout lists them in ``filled_fields``.
    ``use_transformers``: True requires transformers, False never uses it, None
    (default) uses it when installed unless ``PAGEDKV_TRANSFORMERS=0``, except for
    bundled configs: tests prove both paths give the same specs for those, and
    importing transformers costs seconds.
    """
    source = load_model_config(model)
    adapter = find_adapter(source)
    if use_transformers is None and transformers_mode(None) is None and _is_bundled(source):
        use_transformers = False
    normalized, _ = normalize_with_transformers(source.name, source.raw, use_transformers)
    text_type = text_model_type(source.model_type, source.text_config)
    defaults = class_defaults(
        text_type, use_transformers=transformers_mode(use_transformers) is not False
    )
    origin = str(source.path) if source.path is not None else None
    view = ConfigView(
        source.name,
        source.text_config,
        normalized,
        defaults=defaults.values if defaults else None,
        origin=origin,
    )
    layout = adapter.describe(view, source)
    return dataclasses.replace(
        layout,
        filled_fields=tuple(sorted(view.filled.items())),
        defaults_from=_defaults_label(defaults, normalized is not None),
    )


def _defaults_label(defaults: ClassDefaults | None, normalized: bool) -> str | None:
    """Where filled-in fields came from, in words."""
    if normalized:
        return "transformers' config class"
    if defaults is None:
        return None
    where = "transformers" if defaults.source == "transformers" else "pagedkv's copy"
    return f"{defaults.model_type} class defaults ({where})"


def _is_bundled(source: ModelSource) -> bool:
    return source.path is not None and source.path.parent.parent == bundled_models_dir()
