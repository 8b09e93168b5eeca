"""vLLM's flag spellings on `plan` and `simulate`, their values, and usage errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer

from pagedkv.cli.app import main
from pagedkv.cli.common import parse_human_int, parse_max_model_len, vllm_scheduler_defaults


@pytest.fixture(autouse=True)
def _no_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["plan", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        *[("32768", 32768), ("32k", 32000), ("32K", 32768), ("1M", 2**20), ("1m", 10**6)],
        *[("25.6k", 25600), ("-1", -1), ("auto", -1)],
    ],
)
def test_max_model_len_reads_vllm_forms(text: str, tokens: int) -> None:
    assert parse_max_model_len(text) == tokens


@pytest.mark.parametrize("text", ["1.5K", "lots", "0", "-2", "32kb"])
def test_max_model_len_rejects(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_max_model_len(text)


def test_human_int_binary_suffixes() -> None:
    assert parse_human_int("2G") == 2 * 2**30 and parse_human_int("2g") == 2 * 10**9


def test_vllm_serve_scheduler_defaults() -> None:
    assert vllm_scheduler_defaults(80 * 10**9, "H100-80GB") == (1024, 8192)
    assert vllm_scheduler_defaults(80 * 2**30, "A100-80GB") == (256, 2048)
    assert vllm_scheduler_defaults(24 * 10**9, "L4") == (256, 2048)
    assert vllm_scheduler_defaults(None, "") == (256, 2048)
    h100 = vllm_scheduler_defaults(80 * 10**9, "H100-80GB")
    assert (h100.max_num_seqs, h100.max_num_batched_tokens) == (1024, 8192)


def test_vllm_spellings_equal_the_short_ones(capsys: pytest.CaptureFixture[str]) -> None:
    long = plan_json(
        capsys,
        "Llama-3.1-8B",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--kv-cache-memory-bytes",
        "20G",
        "--max-model-len",
        "32K",
    )
    short = plan_json(capsys, "Llama-3.1-8B", "-tp", "2", "-pp", "2", "--kv-cache-memory", "20GiB")
    old = plan_json(capsys, "Llama-3.1-8B", "--tp", "2", "--pp", "2", "--max-model-len", "32768")
    assert long["max_model_len"] == 32768 and long["memory"]["kv_cache_bytes"] == 20 * 2**30
    assert (long["tensor_parallel_size"], long["pipeline_parallel_size"]) == (2, 2)
    assert long["num_blocks"] == short["num_blocks"]
    assert (old["tensor_parallel_size"], old["pipeline_parallel_size"]) == (2, 2)


def test_scheduler_flags_size_the_activation_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    default = plan_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--max-model-len", "16k")
    assert (default["max_num_seqs"], default["max_num_batched_tokens"]) == (256, 2048)
    flags = ["--max-num-batched-tokens", "8192", "--max-num-seqs", "512"]
    bigger = plan_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--max-model-len", "16k", *flags)
    assert bigger["memory"]["activation_bytes"] > default["memory"]["activation_bytes"]
    assert bigger["num_blocks"] < default["num_blocks"]


def test_num_gpu_blocks_override_and_prefix_caching(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_json(
        capsys, "Llama-3.1-8B", "--num-gpu-blocks-override", "1000", "--max-model-len", "4k",
        "--no-enable-prefix-caching", "--prefix-caching-hash-algo", "xxhash",
    )  # fmt: skip
    assert out["num_blocks"] == 1000 and out["enable_prefix_caching"] is False


def test_fp8_ds_mla_packs_656_bytes_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_json(capsys, "DeepSeek-V3", "--gpu", "H200", "-tp", "8", "--kv-cache-dtype",
                    "fp8_ds_mla")  # fmt: skip
    assert out["groups"][0]["page_size_bytes"] == 16 * 656 * 61


def test_fp8_ds_mla_on_a_non_mla_model_is_an_input_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "Llama-3.1-8B", "--kv-cache-dtype", "fp8_ds_mla"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "applies to MLA models only" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--kv-cache-dtype", "fp3"], "unknown KV cache dtype 'fp3'"),
        (["plan", "--block-size", "48"], "48 is not a block size vLLM accepts"),
        (["plan", "--max-model-len", "1.5K"], "binary suffixes like K take whole numbers"),
        (["plan", "-tp", "0"], "Invalid value for '--tensor-parallel-size'"),
        (["plan", "--prefix-caching-hash-algo", "md5"], "unknown hash algorithm 'md5'"),
        (["plan", "--no-such-flag"], "No such option: --no-such-flag"),
        (["simulate", "--num-blocks", "1e12"], "'--num-blocks'"),
        (["simulate", "--block-size", "17"], "17 is not a block size"),
        (["nonsense"], "No such command 'nonsense'"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("error: "), out.err
    assert out.out == ""


def test_simulate_takes_vllm_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "Llama-3.1-8B", "--num-gpu-blocks-override", "400", "--limit", "5"]
    args += ["--trace", "synthetic:20:1", "--prefix-caching-hash-algo", "sha256", "--json"]
    assert main([*args, "--max-model-len", "4k", "--no-enable-prefix-caching"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert off["hit_tokens"] == 0 and off["num_blocks"] == on["num_blocks"] == 400


def test_gpu_local_plans_the_free_memory(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        mem_get_info=lambda device: (60 * 2**30, 80 * 2**30),
        get_device_name=lambda device: "NVIDIA H100 80GB HBM3",
        get_device_capability=lambda device: (9, 0),
    )
    version = types.SimpleNamespace(hip=None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda, version=version))
    out = plan_json(capsys, "Llama-3.1-8B", "--gpu", "local", "--max-model-len", "32k")
    assert out["gpu"] == "NVIDIA H100 80GB HBM3"
    assert out["memory"]["device_bytes"] == 60 * 2**30
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (1024, 8192)


def test_gpu_h20_plans_an_h20(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_json(capsys, "Llama-3.1-8B", "--gpu", "H20")
    assert out["gpu"] == "H20" and out["memory"]["device_bytes"] == 96 * 2**30
    assert main(["plan", "--gpu", "H100"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ambiguous: it could be H100-80GB, H100-PCIe, H100-NVL" in err


PLATFORM_MODULE = """
from pagedkv.platforms import Platform


class Wide32Platform(Platform):
    name = "wide32"

    @classmethod
    def kv_cache_block_size_multiple(cls, config):
        return 32
"""


def test_platform_flag_decides_the_block_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pagedkv.platforms import set_current_platform

    (tmp_path / "wide32_platform.py").write_text(PLATFORM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PAGEDKV_PLATFORM", "generic")  # restored (and reset) after the test
    set_current_platform(None)
    try:
        flag = ["--platform", "wide32_platform.Wide32Platform"]
        assert main(["plan", *flag, "--block-size", "16"]) == 2
        err = capsys.readouterr().err
        assert "16 is not a block size vLLM accepts on the wide32 platform" in err
        assert "(one of 32, 64, 128, 256)" in err
        out = plan_json(capsys, "Llama-3.1-8B", *flag, "--block-size", "32",
                        "--kv-cache-memory-bytes", "10GiB", "--max-model-len", "8k")  # fmt: skip
        assert out["block_size"] == 32
        assert main(["plan", "--platform", "no_such_platform"]) == 1
        assert "no_such_platform" in capsys.readouterr().err
    finally:
        set_current_platform(None)


def _terms(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in out["memory"]["terms"]}


SERVE_LINE = (
    "Llama-3.1-8B --host 0.0.0.0 --port 8000 --served-model-name llama --trust-remote-code "
    "--dtype bfloat16 --gpu-memory-utilization 0.85 --max-model-len 32k --max-num-seqs 256 "
    "--max-num-batched-tokens 4096 --kv-cache-dtype fp8 --block-size 32 -tp 2 -pp 1 "
    "--data-parallel-size 2 --enforce-eager --cpu-offload-gb 1"
)


def test_a_whole_vllm_serve_line_pastes_in(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_json(capsys, *SERVE_LINE.split(), "--gpu", "H100-80GB")
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (256, 4096)
    assert out["kv_cache_dtype"].startswith("fp8") and out["block_size"] == 32
    assert _terms(out)["CUDA graph estimate"]["bytes"] == 0  # --enforce-eager
    # The flags that change nothing are accepted and say so.
    bare = plan_json(capsys, *SERVE_LINE.replace(
        "--host 0.0.0.0 --port 8000 --served-model-name llama --trust-remote-code ", "").split(),
        "--gpu", "H100-80GB")  # fmt: skip
    assert bare["num_blocks"] == out["num_blocks"]


def test_help_names_the_flags_that_change_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--trust-remote-code", "--host", "--port", "--served-model-name"):
        assert flag in text
    assert text.count("does not change a plan") >= 4


def test_enforce_eager_drops_the_cuda_graph_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    graphs = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k")
    eager = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k", "--enforce-eager")
    assert _terms(graphs)["CUDA graph estimate"]["bytes"] > 0
    assert _terms(eager)["CUDA graph estimate"]["bytes"] == 0
    assert eager["memory"]["kv_cache_bytes"] > graphs["memory"]["kv_cache_bytes"]


def test_dtype_and_online_fp8_change_the_weights(capsys: pytest.CaptureFixture[str]) -> None:
    base = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k")
    half = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k", "--dtype", "half")
    fp8 = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k", "-q", "fp8")
    assert half["weights_dtype"] == half["kv_cache_dtype"] == "float16"
    assert fp8["weights_dtype"].startswith("fp8 (online")
    # Linear layers at 1 byte; embedding and head stay bf16 (2 x 128256 x 4096 params).
    embed = 2 * 128256 * 4096 * 2
    linear = base["memory"]["weight_bytes"] - embed
    assert fp8["memory"]["weight_bytes"] == pytest.approx(embed + linear / 2, rel=1e-6)
    assert main(["plan", "--dtype", "fp7"]) == 2
    assert "unknown dtype 'fp7'" in capsys.readouterr().err


def test_stored_dtype_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    deepseek = plan_json(capsys, "DeepSeek-V3", "--gpu", "H200", "-tp", "8")
    assert deepseek["weights_dtype"] == "fp8 (block 128x128)"
    oss = plan_json(capsys, "gpt-oss-20b")
    assert oss["weights_dtype"] == "mxfp4 experts, bfloat16 rest"


def test_expert_parallel_splits_experts_over_tp_x_dp(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["Qwen3.5-35B-A3B", "--gpu", "H200", "-tp", "2", "-dp", "4"]
    sharded = plan_json(capsys, *args)
    split = plan_json(capsys, *args, "--enable-expert-parallel")
    assert split["memory"]["weight_bytes"] < sharded["memory"]["weight_bytes"]
    assert split["num_blocks"] > sharded["num_blocks"]


def test_speculative_mtp_loads_the_mtp_layers(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["DeepSeek-V3", "--gpu", "H200", "-tp", "8"]
    plain = plan_json(capsys, *args)
    mtp = plan_json(
        capsys, *args, "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'
    )
    assert mtp["memory"]["weight_bytes"] > plain["memory"]["weight_bytes"]
    assert main(["plan", *args, "--speculative-config", "{method: mtp}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--speculative-config is not JSON" in err


def test_cpu_offload_takes_weights_off_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    base = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k")
    offload = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k", "--cpu-offload-gb", "4")
    assert base["memory"]["weight_bytes"] - offload["memory"]["weight_bytes"] == 4 * 2**30


def test_vllm_version_selects_that_releases_accounting(capsys: pytest.CaptureFixture[str]) -> None:
    now = _terms(plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k"))
    old = _terms(
        plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k", "--vllm-version", "0.11.0")
    )
    assert old["sampler warm-up"]["bytes"] > 2 * now["sampler warm-up"]["bytes"]
    assert old["CUDA graph estimate"]["bytes"] == 0 < now["CUDA graph estimate"]["bytes"]
    assert main(["plan", "--vllm-version", "latest"]) == 1
    assert "cannot read a vLLM version" in capsys.readouterr().err


def test_tables_print_vllms_own_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "Llama-3.1-8B", "--max-model-len", "16k"]) == 0
    text = capsys.readouterr().out
    out = plan_json(capsys, "Llama-3.1-8B", "--max-model-len", "16k")
    assert f"GPU KV cache size: {out['vllm_kv_cache_tokens']:,} tokens" in text
    assert (
        f"Maximum concurrency for 16,000 tokens per request: {out['max_concurrency']:.2f}x" in text
    )
    # Null block counted, as vLLM counts it: num_blocks x block_size at one group.
    assert out["vllm_kv_cache_tokens"] == out["num_blocks"] * 16


def test_scheduler_default_tiers() -> None:
    assert vllm_scheduler_defaults(178 * 2**30, "B200") == (1024, 16384)
    assert vllm_scheduler_defaults(int(139.81 * 2**30), "H200-141GB") == (1024, 8192)
    assert vllm_scheduler_defaults(121 * 2**30, "NVIDIA GB10") == (256, 2048)
