"""Loading configs, error messages, and registering adapters for new architectures."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv.errors import ModelConfigError, RegistryError
from pagedkv.models import (
    AttentionLayer,
    ConfigView,
    ModelAdapter,
    ModelLayout,
    ModelSource,
    Unit,
    describe_model,
    get_kv_cache_specs,
    list_bundled_models,
    load_model_config,
    register_model_adapter,
    unregister_model_adapter,
)
from pagedkv.models.adapters import find_adapter
from pagedkv.models.adapters.dense import Gemma3Adapter
from pagedkv.models.source import normalize_with_transformers
from pagedkv.specs import FullAttentionSpec

LLAMA = load_model_config("Llama-3.1-8B").raw


def write(tmp_path: Path, data: dict | str, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_bundled_name_directory_and_file(tmp_path: Path) -> None:
    by_name = load_model_config("Llama-3.1-8B")
    assert by_name.name == "Llama-3.1-8B" and by_name.architecture == "LlamaForCausalLM"
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    write(model_dir, LLAMA)
    assert load_model_config(model_dir).name == "my-model"
    assert load_model_config(model_dir / "config.json").raw == LLAMA
    other = write(tmp_path, LLAMA, "llama.json")
    assert load_model_config(str(other)).name == "llama"
    assert load_model_config(by_name) is by_name


def test_infinity_in_json_is_read() -> None:
    source = load_model_config("Nemotron-H-56B-Base-8K")
    assert source.raw["time_step_limit"][1] == float("inf")


def test_mamba_ssm_format_is_recognised() -> None:
    assert load_model_config("mamba2-2.7b").model_type == "mamba_ssm"


def test_unknown_path_lists_bundled_models() -> None:
    with pytest.raises(ModelConfigError) as info:
        load_model_config("no-such-model")
    message = str(info.value)
    assert "\n" not in message and "no-such-model" in message and "Llama-3.1-8B" in message


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{"architectures": [\n  "LlamaForCausalLM",\n}')
    with pytest.raises(ModelConfigError, match=r"not valid JSON \(line 3"):
        load_model_config(path)
    with pytest.raises(ModelConfigError, match="must hold a JSON object"):
        load_model_config(write(tmp_path, "[1, 2]", "list.json"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelConfigError, match=r"no config\.json"):
        load_model_config(empty)


def test_unknown_architecture_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, {"architectures": ["FancyNewForCausalLM"], "model_type": "fancy"})
    with pytest.raises(ModelConfigError) as info:
        describe_model(path, use_transformers=False)
    message = str(info.value)
    assert "FancyNewForCausalLM" in message and "'architectures'" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("num_key_value_heads", 0, r"'num_key_value_heads' must be an integer >= 1, got 0"),
        ("num_hidden_layers", None, r"'num_hidden_layers' is missing"),
        ("hidden_size", "big", r"'hidden_size' must be an integer"),
    ],
)
def test_bad_field_names_model_and_field(
    tmp_path: Path, field: str, value: object, pattern: str
) -> None:
    data = dict(LLAMA)
    if value is None:
        # A model type with no known class defaults: a missing field is truly missing.
        del data[field]
        data["model_type"] = "llama_fork"
    else:
        data[field] = value
    model_dir = tmp_path / "broken-llama"
    model_dir.mkdir()
    write(model_dir, data)
    with pytest.raises(ModelConfigError, match=f"broken-llama: config field {pattern}"):
        get_kv_cache_specs(model_dir, use_transformers=False)


def test_layer_types_length_mismatch(tmp_path: Path) -> None:
    data = {**LLAMA, "layer_types": ["full_attention"] * 3}
    with pytest.raises(ModelConfigError, match="'layer_types' has 3 entries for 32 layers"):
        describe_model(write(tmp_path, data), use_transformers=False)


def test_published_values_win_over_normalised_ones() -> None:
    view = ConfigView("m", {"a": 1, "b": None}, {"a": 2, "b": 3, "c": 4})
    assert (view.get("a"), view.get("b"), view.get("c"), view.get("d", 5)) == (1, 3, 4, 5)
    assert view.sub("missing").get("x") is None


def test_published_null_overrides_a_class_default_and_fills_are_recorded() -> None:
    view = ConfigView("m", {"sliding_window": None}, defaults={"sliding_window": 4096, "v": 7})
    assert not view.has("sliding_window")
    assert view.get("v") == 7 and view.filled == {"v": 7}


def test_transformers_normalisation_fills_derived_fields() -> None:
    pytest.importorskip("transformers")
    raw = load_model_config("gemma-2-9b-it").raw
    normalized, cls = normalize_with_transformers("gemma-2-9b-it", raw, True)
    assert cls == "Gemma2Config" and normalized is not None
    assert normalized["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert normalize_with_transformers("x", raw, False) == (None, None)
    assert normalize_with_transformers("x", {"model_type": "no-such-type"}, None) == (None, None)


class TinyAdapter(ModelAdapter):
    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        layers = view.int("n")
        units = tuple(
            Unit(i, (AttentionLayer(f"blk.{i}.attn", 4, 2, view.int("head")),), 10)
            for i in range(layers)
        )
        return ModelLayout(
            name=view.model,
            architecture="Tiny",
            dtype="float16",
            units=units,
            hidden_size=64,
            intermediate_size=128,
            embedding_params=0,
            head_params=0,
        )


def test_register_adapter_for_new_architecture(tmp_path: Path) -> None:
    path = write(tmp_path, {"architectures": ["TinyForCausalLM"], "n": 3, "head": 32})
    register_model_adapter("TinyForCausalLM")(TinyAdapter)
    try:
        (specs,) = get_kv_cache_specs(path, use_transformers=False)
        assert list(specs) == ["blk.0.attn", "blk.1.attn", "blk.2.attn"]
        spec = specs["blk.0.attn"]
        assert isinstance(spec, FullAttentionSpec) and spec.dtype == "float16"

        class Other(TinyAdapter):
            pass

        with pytest.raises(RegistryError, match="already TinyAdapter"):
            register_model_adapter("TinyForCausalLM")(Other)
        register_model_adapter("TinyForCausalLM", override=True)(Other)
    finally:
        unregister_model_adapter("TinyForCausalLM")
    with pytest.raises(RegistryError, match="not a ModelAdapter"):
        register_model_adapter("X")(int)  # type: ignore[arg-type]


def test_bundled_list_is_sorted_and_complete() -> None:
    names = list_bundled_models()
    assert names == sorted(names, key=str.lower)
    assert {"Llama-3.1-8B", "Jamba-v0.1", "whisper-large-v3"} <= set(names)


def test_adapter_family_bases_are_abstract_and_every_registered_adapter_is_concrete() -> None:
    from pagedkv.models.adapters import _adapters, registered_adapter_names
    from pagedkv.models.adapters.encdec import EncoderDecoderAdapter
    from pagedkv.models.adapters.hybrid import HybridAdapter

    for base in (EncoderDecoderAdapter, HybridAdapter):
        with pytest.raises(TypeError, match="abstract"):
            base()  # type: ignore[abstract]
    for name in registered_adapter_names():
        assert isinstance(_adapters[name](), ModelAdapter), name


@pytest.mark.parametrize(
    "name", ["Llama-3.1-8B", "whisper-large-v3", "mamba2-2.7b", "Jamba-v0.1", "DeepSeek-V2-Lite"]
)
def test_every_adapter_family_records_the_quantization_method(tmp_path: Path, name: str) -> None:
    raw = dict(load_model_config(name).raw)
    assert describe_model(name, use_transformers=False).quant_method is None
    raw["quantization_config"] = {"quant_method": "FP8"}
    layout = describe_model(write(tmp_path, raw), use_transformers=False)
    assert layout.quant_method == "fp8"
    assert layout.name and layout.architecture and layout.dtype


def test_every_concrete_family_adapter_is_in_the_builtin_table() -> None:
    import importlib
    import inspect

    from pagedkv.models.adapters import BUILTIN_ADAPTERS

    listed = set(BUILTIN_ADAPTERS)
    for module in ("dense", "mla", "hybrid", "encdec", "mamba_ssm"):
        mod = importlib.import_module(f"pagedkv.models.adapters.{module}")
        for name, cls in vars(mod).items():
            own = inspect.isclass(cls) and cls.__module__ == mod.__name__
            if own and issubclass(cls, ModelAdapter) and not inspect.isabstract(cls):
                assert f"{module}.{name}" in listed, f"{module}.{name} reads no architecture"
    names = [n for names in BUILTIN_ADAPTERS.values() for n in names]
    assert len(names) == len(set(names)), "a name is listed for two adapters"


def test_registering_over_a_builtin_name_raises_unless_override() -> None:
    class Mine(TinyAdapter):
        pass

    with pytest.raises(RegistryError, match="already Gemma3Adapter"):
        register_model_adapter("gemma3_text")(Mine)
    register_model_adapter("gemma3_text", override=True)(Mine)
    try:
        raw = {"architectures": ["NoSuchArch"], "model_type": "gemma3_text"}
        assert type(find_adapter(ModelSource("x", raw))) is Mine
    finally:
        unregister_model_adapter("gemma3_text")
        register_model_adapter("gemma3_text")(Gemma3Adapter)


@pytest.mark.slow
def test_a_lookup_imports_only_the_family_module_it_needs() -> None:
    code = (
        "import sys\n"
        "from pagedkv.models import describe_model\n"
        "describe_model('gemma-3-27b-it', use_transformers=False)\n"
        "print(sorted(m for m in sys.modules if m.startswith('pagedkv.models.adapters.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ast.literal_eval(done.stdout.strip()) == [
        "pagedkv.models.adapters.common",
        "pagedkv.models.adapters.dense",
    ]
