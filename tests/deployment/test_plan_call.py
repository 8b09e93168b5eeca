"""``pagedkv.plan`` is the one answer: the CLI's ``plan`` and ``simulate``, the
simulator's ``setup_from_model`` and the library call agree on the block count for
the same inputs, and the notebook view shows rounded, labelled figures."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

import pagedkv
from pagedkv.cli.app import main
from pagedkv.deployment import DeploymentPlan, VLLMFlags
from pagedkv.errors import ConfigError
from pagedkv.sim.setup import setup_from_model


def _cli_json(*argv: str) -> dict[str, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    assert code in (0, None)
    data: dict[str, object] = json.loads(out.getvalue())
    return data


CASES = [
    ("Llama-3.1-8B", "H100-80GB", 1, {}),
    ("gemma-3-27b-it", "H200", 2, {"max_num_seqs": 64}),
    ("Qwen3.5-35B-A3B", "A100-80GB", 1, {"max_model_len": 32768}),
]


def _flags(options: dict[str, int]) -> list[str]:
    return [
        arg
        for name, value in options.items()
        for arg in (f"--{name.replace('_', '-')}", str(value))
    ]


@pytest.mark.parametrize(("model", "gpu", "tp", "options"), CASES)
def test_library_cli_plan_simulate_and_sim_setup_agree(
    model: str, gpu: str, tp: int, options: dict[str, int]
) -> None:
    library = pagedkv.plan(model, gpu=gpu, tensor_parallel_size=tp, **options)  # type: ignore[arg-type]
    common = [model, "--gpu", gpu, "-tp", str(tp), *_flags(options)]
    planned = _cli_json("plan", *common)
    simulated = _cli_json("simulate", *common, "--trace", "synthetic:2:1", "--limit", "2")
    setup = setup_from_model(model, gpu=gpu, tensor_parallel_size=tp, **options)  # type: ignore[arg-type]
    assert library.num_blocks == planned["num_blocks"]
    assert library.num_blocks == simulated["num_blocks"]
    assert library.num_blocks == setup.num_blocks


def test_the_default_gpu_and_defaults_match_the_cli() -> None:
    assert (
        pagedkv.plan("Llama-3.1-8B").num_blocks == _cli_json("plan", "Llama-3.1-8B")["num_blocks"]
    )


def test_unknown_flag_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown vLLM flag 'max_num_seq'"):
        pagedkv.plan("Llama-3.1-8B", max_num_seq=64)  # type: ignore[call-arg]


def test_flags_take_vllm_defaults_when_unset() -> None:
    result = pagedkv.plan("Llama-3.1-8B", gpu="H100-80GB")
    assert (
        result.config.scheduler.max_num_seqs,
        result.config.scheduler.max_num_batched_tokens,
    ) == (1024, 8192)
    small = pagedkv.plan("Llama-3.1-8B", gpu="L4", max_model_len=8192)
    assert small.config.scheduler.max_num_seqs == 256
    assert VLLMFlags().block_size == 16


RAW_FLOAT = re.compile(r"\d+\.\d{3,}")


def test_notebook_views_are_rounded_and_labelled() -> None:
    result = pagedkv.plan("gemma-3-27b-it")
    assert isinstance(result, DeploymentPlan)
    text = str(result)
    html = result._repr_html_()
    assert f"{result.num_blocks:,} x 16 tokens" in text and f"{result.num_blocks:,}" in html
    assert "max concurrency at max_model_len" in text and "x" in text
    assert "vocab_size 262,208" in text  # the defaulted fields are named
    for view in (text, html, result.kv_cache._repr_html_()):
        assert not RAW_FLOAT.search(view), view

    class Printer:
        def __init__(self) -> None:
            self.parts: list[str] = []

        def text(self, part: str) -> None:
            self.parts.append(part)

    printer = Printer()
    result._repr_pretty_(printer, False)
    assert printer.parts == [text]


def test_repr_is_one_short_line() -> None:
    result = pagedkv.plan("Llama-3.1-8B", kv_cache_memory_bytes=8 << 30, max_model_len=8192)
    assert repr(result).startswith("DeploymentPlan(model='Llama-3.1-8B', where='given memory'")
    assert "\n" not in repr(result)


STARTUP_CASES = [
    ({"enforce_eager": True}, ["--enforce-eager"]),
    ({"dtype": "float16"}, ["--dtype", "float16"]),
    ({"quantization": "fp8"}, ["--quantization", "fp8"]),
    ({"cpu_offload_gb": 4.0}, ["--cpu-offload-gb", "4"]),
    ({"speculative_config": '{"method": "mtp"}'}, ["--speculative-config", '{"method": "mtp"}']),
    ({"kv_cache_layout": "BLNHC"}, ["--kv-cache-layout", "BLNHC"]),
]


@pytest.mark.parametrize(("flags", "argv"), STARTUP_CASES)
def test_start_up_flags_are_vllm_flags_of_the_one_call(
    flags: dict[str, object], argv: list[str]
) -> None:
    library = pagedkv.plan("Llama-3.1-8B", **flags)  # type: ignore[arg-type]
    planned = _cli_json("plan", "Llama-3.1-8B", *argv)
    assert library.num_blocks == planned["num_blocks"]
    assert library.budgets[0].kv_cache_bytes == planned["memory"]["kv_cache_bytes"]  # type: ignore[index]


def test_start_up_flags_change_the_plan() -> None:
    default = pagedkv.plan("Llama-3.1-8B")
    # no CUDA graph estimate: more memory left for the KV cache
    assert pagedkv.plan("Llama-3.1-8B", enforce_eager=True).num_blocks > default.num_blocks
    # weights kept in CPU memory leave more for the KV cache too
    assert pagedkv.plan("Llama-3.1-8B", cpu_offload_gb=4.0).num_blocks > default.num_blocks
    old = pagedkv.plan("Llama-3.1-8B", vllm_version="0.10.0")
    assert old.budgets[0].kv_cache_bytes != default.budgets[0].kv_cache_bytes
    assert pagedkv.plan("Llama-3.1-8B", kv_cache_layout="BLNHC").config.cache.kv_cache_layout == (
        "BLNHC"
    )
