"""The options that declare the ``vllm serve`` flags changing start-up memory (so a
whole ``vllm serve`` line pastes into ``plan``); ``deployment.startup`` reads them.

Flags that do not change a plan are accepted and say so in ``--help``.
"""

from __future__ import annotations

import typer

from pagedkv.deployment.startup import VLLM_DTYPES

__all__ = [
    "NO_EFFECT",
    "check_dtype",
    "ENFORCE_EAGER_OPTION",
    "DTYPE_OPTION",
    "QUANTIZATION_OPTION",
    "TRUST_REMOTE_CODE_OPTION",
    "DATA_PARALLEL_OPTION",
    "EXPERT_PARALLEL_OPTION",
    "SPECULATIVE_OPTION",
    "CPU_OFFLOAD_OPTION",
    "VLLM_VERSION_OPTION",
    "FLASHINFER_SAMPLER_OPTION",
    "HOST_OPTION",
    "PORT_OPTION",
    "SERVED_NAME_OPTION",
]

NO_EFFECT = "Accepted for vLLM command lines; it does not change a plan."


def check_dtype(value: str) -> str:
    if value not in VLLM_DTYPES:
        raise typer.BadParameter(f"unknown dtype {value!r}; vLLM's: {', '.join(VLLM_DTYPES)}")
    return value


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
FLASHINFER_SAMPLER_OPTION = typer.Option(
    True,
    "--flashinfer-sampler/--no-flashinfer-sampler",
    help="Whether FlashInfer's sampler is installed and enabled (VLLM_USE_FLASHINFER_SAMPLER); "
    "without it --vllm-version before 0.11 warms the native top-k/top-p sort up.",
)
HOST_OPTION = typer.Option(None, "--host", help=NO_EFFECT)
PORT_OPTION = typer.Option(None, "--port", help=NO_EFFECT)
SERVED_NAME_OPTION = typer.Option([], "--served-model-name", help=NO_EFFECT)
