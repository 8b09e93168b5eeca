"""Helpers every command shares: byte sizes, numbers, consoles, and the options `plan`,
`simulate` and `generate` share, spelled as vLLM spells them (old names kept as aliases).

Option values are checked while the command line is read, so a bad one is a usage error
(exit 2).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import typer
from rich.console import Console

from pagedkv.deployment.format import format_bytes, format_int, format_percent
from pagedkv.deployment.options import DEFAULT_GPU, vllm_scheduler_defaults
from pagedkv.dtypes import canonical_dtype_name
from pagedkv.errors import ConfigError, UnknownDtypeError

__all__ = [
    "DEFAULT_GPU",
    "format_bytes",
    "format_int",
    "format_percent",
    "parse_bytes",
    "parse_human_int",
    "parse_max_model_len",
    "stderr_console",
    "stdout_console",
    "vllm_scheduler_defaults",
]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# One-letter suffixes as vLLM reads them: lowercase decimal, uppercase binary.
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_LETTERS = _DECIMAL | _BINARY
# Nothing pagedkv plans has a petabyte per device; larger figures are typos.
MAX_BYTES = 2**50
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str, option: str) -> int:
    """``80GiB``, ``80GB`` (decimal), ``40G`` (vLLM: GiB), ``1.5e9`` or an integer, as bytes."""
    match = _SIZE.match(text)
    unit = match.group(2) if match else ""
    scale = _LETTERS.get(unit) or _UNITS.get(unit.lower())
    if match is None or scale is None:
        raise ConfigError(
            f"{option}: cannot read {text!r} as a size (examples: 80GiB, 80GB, 85899345920)"
        )
    value = float(match.group(1)) * scale
    if not 1 <= value <= MAX_BYTES:
        raise ConfigError(
            f"{option}: size must be between 1 byte and {MAX_BYTES:,} bytes (1 PiB), got {text!r}"
        )
    return int(value)


def stdout_console() -> Console:
    """Rich output at the terminal's width, or ``$COLUMNS`` (80 if unset) when piped."""
    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


# vLLM's CacheConfig block sizes; a platform may narrow them to multiples of its own.
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# vLLM's --kv-cache-dtype choices pagedkv can size (fp8_ds_mla: MLA models only).
VLLM_KV_CACHE_DTYPES = (
    "auto",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "fp8_per_token_head",
    "int8_per_token_head",
    "nvfp4",
)
# vLLM's --prefix-caching-hash-algo names, and pagedkv's own.
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxhash128", "builtin")

_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")


def parse_human_int(text: str, hint: str = "--max-model-len") -> int:
    """vLLM's human-readable integers: ``32k`` = 32,000, ``32K`` = 32,768, ``1M`` = 2**20.

    Lowercase suffixes are decimal and take decimals (``25.6k``); uppercase ones are
    binary and need a whole number. Anything else must be a plain integer.
    """
    value = text.strip()
    match = _HUMAN_INT.match(value)
    if match is None:
        try:
            return int(value)
        except ValueError:
            raise typer.BadParameter(
                f"cannot read {text!r} as a number of tokens (examples: 32768, 32k, 32K, 1M, -1)",
                param_hint=hint,
            ) from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise typer.BadParameter(
            f"{text!r}: decimals need a decimal suffix ({number}{suffix.lower()}); "
            f"binary suffixes like {suffix} take whole numbers",
            param_hint=hint,
        )
    return int(number) * _BINARY[suffix]


def parse_max_model_len(text: str | None) -> int | None:
    """``--max-model-len``: a human-readable count, or ``-1`` / ``auto`` (fit the largest)."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        return -1
    value = parse_human_int(text)
    if value == -1 or value > 0:
        return value
    raise typer.BadParameter(
        f"must be a positive number of tokens or -1 (auto), got {text!r}",
        param_hint="--max-model-len",
    )


def check_kv_cache_dtype(value: str) -> str:
    if value in VLLM_KV_CACHE_DTYPES:
        return value
    try:
        canonical_dtype_name(value)
    except UnknownDtypeError:
        raise typer.BadParameter(
            f"unknown KV cache dtype {value!r}; vLLM's: {', '.join(VLLM_KV_CACHE_DTYPES)}"
        ) from None
    return value


def check_block_size(value: int) -> int:
    from pagedkv.platforms import get_current_platform

    platform = get_current_platform()
    multiple = platform.kv_cache_block_size_multiple(None)
    allowed = [n for n in VLLM_BLOCK_SIZES if n % multiple == 0]
    if value not in allowed:
        raise typer.BadParameter(
            f"{value} is not a block size vLLM accepts on the {platform.name} platform "
            f"(one of {', '.join(map(str, allowed))})"
        )
    return value


def check_hash_algo(value: str) -> str:
    if value not in HASH_ALGOS:
        raise typer.BadParameter(
            f"unknown hash algorithm {value!r}; known: {', '.join(HASH_ALGOS)}"
        )
    return value


def check_retention(name: str) -> None:
    """``--retention``: a name in the table the runtime resolves retentions from
    (``config.PREFIX_CACHE_RETENTIONS``; plugins, which load with the registry, may add one)."""
    from pagedkv.config import PREFIX_CACHE_RETENTIONS
    from pagedkv.registry import KVCacheSpecRegistry

    KVCacheSpecRegistry.ensure_registered()
    if name not in PREFIX_CACHE_RETENTIONS:
        known = " or ".join(map(repr, PREFIX_CACHE_RETENTIONS))
        raise ConfigError(f"--retention must be {known}, got {name!r}")


def check_output_dir(option: str, path: str | Path) -> None:
    """An output file's directory must exist: checked before any work is done."""
    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise ConfigError(f"{option}: directory {str(folder)!r} does not exist")


def use_platform(value: str | None) -> str | None:
    """``--platform``: the same choices as ``$PAGEDKV_PLATFORM``, set before anything plans."""
    if value:
        from pagedkv.platforms import set_current_platform

        os.environ["PAGEDKV_PLATFORM"] = value
        set_current_platform(None)
    return value


PLATFORM_OPTION = typer.Option(
    None,
    "--platform",
    callback=use_platform,
    is_eager=True,
    help="Platform: generic, an installed platform plugin or a class (as $PAGEDKV_PLATFORM).",
)
TP_OPTION = typer.Option(
    1, "--tensor-parallel-size", "-tp", "--tp", min=1, help="Tensor parallel size."
)
PP_OPTION = typer.Option(
    1, "--pipeline-parallel-size", "-pp", "--pp", min=1, help="Pipeline parallel size."
)
BLOCK_SIZE_OPTION = typer.Option(
    16,
    "--block-size",
    callback=check_block_size,
    help=f"Tokens per block: {', '.join(map(str, VLLM_BLOCK_SIZES))} (vLLM's).",
)


def check_max_model_len(value: str | None) -> str | None:
    parse_max_model_len(value)  # a bad value is a usage error while the line is read
    return value


MAX_MODEL_LEN_OPTION = typer.Option(
    None,
    "--max-model-len",
    callback=check_max_model_len,
    help="Tokens per request: 32768, 32k, 32K, 1M, or -1/auto for the largest that fits "
    "(default: the model's).",
)
KV_CACHE_DTYPE_OPTION = typer.Option(
    "auto",
    "--kv-cache-dtype",
    callback=check_kv_cache_dtype,
    help=f"{', '.join(VLLM_KV_CACHE_DTYPES)} (auto: the model's dtype).",
)
PREFIX_CACHING_OPTION = typer.Option(
    None,
    "--enable-prefix-caching/--no-enable-prefix-caching",
    help="Prefix caching (default: on, off for encoder-decoder models).",
)
REVISION_OPTION = typer.Option(
    None, "--revision", help="Hub branch, tag or commit of the model's config (default: main)."
)
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON object.")
