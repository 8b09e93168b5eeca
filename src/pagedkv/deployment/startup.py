"""The ``vllm serve`` flags that change start-up memory, read into the models layer's
``StartupOptions`` (and ``--dtype`` applied to the layout)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pagedkv.deployment.options import VLLMFlags
from pagedkv.dtypes import canonical_dtype_name
from pagedkv.errors import ConfigError, UnknownDtypeError
from pagedkv.models import GPU, ModelLayout
from pagedkv.models.startup_memory import StartupOptions

__all__ = ["VLLM_DTYPES", "parse_speculative_config", "startup_options", "with_dtype"]

# vLLM's --dtype choices.
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# GPUs whose start-up vLLM accounts as Blackwell's.
BLACKWELL_PREFIXES = ("B200", "B300", "GB200")


def with_dtype(layout: ModelLayout, dtype: str) -> ModelLayout:
    """``--dtype``: the model (and ``auto`` KV cache) dtype vLLM runs in."""
    if dtype == "auto":
        return layout
    if dtype not in VLLM_DTYPES:
        raise ConfigError(f"unknown --dtype {dtype!r}; vLLM's: {', '.join(VLLM_DTYPES)}")
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


def startup_options(
    gpu: GPU | None, flags: VLLMFlags, vllm_version: str | None = None
) -> StartupOptions:
    """The start-up accounting ``flags`` and the vLLM release (None: 0.33) ask for."""
    speculative = parse_speculative_config(flags.speculative_config)
    tokens = speculative.get("num_speculative_tokens", 0)
    if flags.cpu_offload_gb < 0:
        raise ConfigError(f"--cpu-offload-gb must be 0 or more, got {flags.cpu_offload_gb!r}")
    options = StartupOptions(
        enforce_eager=flags.enforce_eager,
        cpu_offload_bytes=int(flags.cpu_offload_gb * 2**30),
        quantization=flags.quantization,
        enable_expert_parallel=flags.enable_expert_parallel,
        data_parallel_size=flags.data_parallel_size,
        speculative_method=speculative.get("method"),
        num_speculative_tokens=tokens if isinstance(tokens, int) else 0,
        blackwell=gpu is not None and gpu.name.upper().startswith(BLACKWELL_PREFIXES),
        flashinfer_sampler=flags.flashinfer_sampler,
    )
    return StartupOptions.for_vllm_version(vllm_version, options) if vllm_version else options
