"""The ``vllm serve`` flags that change start-up memory, read into StartupOptions, and
the options that declare them (so a whole ``vllm serve`` line pastes into ``plan``).

Flags that do not change a plan are accepted and say so in ``--help``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer

from pagedkv.dtypes import canonical_dtype_name
from pagedkv.errors import ConfigError, UnknownDtypeError
from pagedkv.models import GPU, ModelLayout
from pagedkv.models.startup_memory import StartupOptions

# vLLM's --dtype choices.
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# Online quantisation pagedkv sizes; other --quantization values name the
# checkpoint's own format (read from its config) and change nothing here.
ONLINE_QUANTIZATION = ("fp8",)
NO_EFFECT = "Accepted for vLLM command lines; it does not change a plan."


def check_dtype(value: str) -> str:
    if value not in VLLM_DTYPES:
        raise typer.BadParameter(f"unknown dtype {value!r}; vLLM's: {', '.join(VLLM_DTYPES)}")
    return value


def with_dtype(layout: ModelLayout, dtype: str) -> ModelLayout:
    """``--dtype``: the model (and ``auto`` KV cache) dtype vLLM runs in."""
    if dtype == "auto":
        return layout
    name = {"half": "float16", "float": "float32"}.get(dtype, dtype)
    try:
        return dataclasses.replace(layout, dtype=canonical_dtype_name(name))
    except UnknownDtypeError:
        raise ConfigError(f"--dtype {dtype!r} is not a dtype pagedkv knows") from None


def parse_speculative_config(text: str | None) -> dict[str, Any]:
    """``--speculative-config``: vLLM's JSON object (``{"method": "mtp", ...}``)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--speculative-config is not JSON: {exc.msg} at column {exc.colno}"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError('--speculative-config must be a JSON object, e.g. \'{"method": "mtp"}\'')
    return value


# PlanRequest fields startup_options reads.
STARTUP_FLAGS = (
    "enforce_eager",
    "cpu_offload_gb",
    "quantization",
    "enable_expert_parallel",
    "data_parallel_size",
    "speculative_config",
    "vllm_version",
)


def startup_options(
    gpu: GPU | None,
    *,
    enforce_eager: bool = False,
    cpu_offload_gb: float = 0.0,
    quantization: str | None = None,
    enable_expert_parallel: bool = False,
    data_parallel_size: int = 1,
    speculative_config: str | None = None,
    vllm_version: str | None = None,
) -> StartupOptions:
    """The start-up accounting the flags and vLLM release ask for."""
    speculative = parse_speculative_config(speculative_config)
    tokens = speculative.get("num_speculative_tokens", 0)
    if cpu_offload_gb < 0:
        raise ConfigError(f"--cpu-offload-gb must be 0 or more, got {cpu_offload_gb!r}")
    flags: dict[str, Any] = {
        "enforce_eager": enforce_eager,
        "cpu_offload_bytes": int(cpu_offload_gb * 2**30),
        "quantization": quantization,
        "enable_expert_parallel": enable_expert_parallel,
        "data_parallel_size": data_parallel_size,
        "speculative_method": speculative.get("method"),
        "num_speculative_tokens": tokens if isinstance(tokens, int) else 0,
        "blackwell": gpu is not None and gpu.name.upper().startswith(("B200", "B300", "GB200")),
    }
    options = StartupOptions(**flags)
    return StartupOptions.for_vllm_version(vllm_version, options) if vllm_version else options


ENFORCE_EAGER_OPTION = typer.Option(
    False, "--enforce-eager", help="No CUDA graphs: vLLM charges no CUDA graph estimate."
)
DTYPE_OPTION = typer.Option(
    "auto",
    "--dtype",
    callback=check_dtype,
    help=f"Model dtype: {', '.join(VLLM_DTYPES)} (auto: the config's); also the auto KV dtype.",
)
QUANTIZATION_OPTION = typer.Option(
    None,
    "--quantization",
    "-q",
    help="fp8 quantises an unquantized checkpoint's linear layers at load; other "
    "methods are read from the checkpoint's quantization_config.",
)
TRUST_REMOTE_CODE_OPTION = typer.Option(False, "--trust-remote-code", help=NO_EFFECT)
DATA_PARALLEL_OPTION = typer.Option(
    1,
    "--data-parallel-size",
    "-dp",
    min=1,
    help="Data-parallel replicas; each plans like one engine, except that experts "
    "split over tp x dp ranks with --enable-expert-parallel.",
)
EXPERT_PARALLEL_OPTION = typer.Option(
    False,
    "--enable-expert-parallel",
    "-ep",
    help="Split MoE experts over the tp x dp ranks instead of sharding each.",
)
SPECULATIVE_OPTION = typer.Option(
    None,
    "--speculative-config",
    help="vLLM's JSON; method mtp loads the config's MTP layers (their weights are "
    "counted; their KV and a separate draft model are not).",
)
CPU_OFFLOAD_OPTION = typer.Option(
    0.0, "--cpu-offload-gb", help="GiB of weights per GPU vLLM keeps in CPU memory."
)
VLLM_VERSION_OPTION = typer.Option(
    None,
    "--vllm-version",
    help="Account memory as this vLLM release did (its sampler warm-up; CUDA graphs "
    "charged from 0.21); default 0.33.",
)
HOST_OPTION = typer.Option(None, "--host", help=NO_EFFECT)
PORT_OPTION = typer.Option(None, "--port", help=NO_EFFECT)
SERVED_NAME_OPTION = typer.Option([], "--served-model-name", help=NO_EFFECT)
