"""Find a trace by bundled name, ``synthetic[:N[:SEED]]``, or file path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pagedkv.errors import TraceFormatError
from pagedkv.sim.traces.readers import MOONCAKE_BLOCK_TOKENS, read_azure, read_mooncake
from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "TRACE_DIR",
    "BUNDLED_TRACES",
    "list_bundled_traces",
    "TraceReadOptions",
    "load_trace",
]

TRACE_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
BUNDLED_TRACES = {
    "mooncake_conversation": "mooncake_conversation.first_half.jsonl.gz",
    "azure_conv": "azure_llm_2023_conv.csv.gz",
    "azure_code": "azure_llm_2023_code.csv.gz",
}


def list_bundled_traces() -> list[str]:
    """Names ``load_trace`` accepts besides paths and ``synthetic[:N[:SEED]]``."""
    return sorted(BUNDLED_TRACES)


def _count(text: str) -> int:
    """An integer, also in float notation when it is whole (``1e6``)."""
    try:
        return int(text)
    except ValueError:
        value = float(text)  # ValueError for anything else
        if not value.is_integer():
            raise
        return int(value)


def _synthetic(spec: str, limit: int | None) -> Trace:
    parts = spec.split(":")[1:]
    try:
        values = [_count(p) for p in parts]
    except (ValueError, OverflowError):
        raise TraceFormatError(f"trace {spec!r}: expected synthetic[:N[:SEED]]") from None
    if len(values) > 2:
        raise TraceFormatError(f"trace {spec!r}: expected synthetic[:N[:SEED]]")
    config = SyntheticTraceConfig()
    if values:
        config = dataclasses.replace(config, num_requests=values[0])
    if len(values) == 2:
        config = dataclasses.replace(config, seed=values[1])
    return synthetic_trace(config, limit)._replace(num_source_requests=config.num_requests)


class TraceReadOptions(NamedTuple):
    """How a trace file is read: hash-id block size, tokenizer for text prompts."""

    skip_bad_lines: bool = False
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    tokenize: Callable[[Any], list[int]] | None = None


def load_trace(
    name_or_path: str | Path,
    *,
    skip_bad_lines: bool = False,
    limit: int | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    tokenize: Callable[[Any], list[int]] | None = None,
) -> Trace:
    """Load a bundled trace by name, generate ``synthetic[:N[:SEED]]``, or read a file;
    only the first ``limit`` requests are read or generated.

    Files ending in ``.jsonl``/``.json`` (optionally ``.gz``) are JSONL traces: Mooncake
    records whose hash ids cover ``block_tokens`` tokens each, or records with
    ``token_ids``, a ``prompt`` or chat ``messages`` (text needs ``tokenize``, the
    model's tokenizer); ``.csv`` (optionally ``.gz``) Azure LLM inference traces.

    Args:
        name_or_path: a bundled trace's name, ``synthetic[:N[:SEED]]`` or a file path.
        skip_bad_lines: skip and count malformed lines instead of raising.
        limit: requests read or generated (None: all).
        block_tokens: tokens per Mooncake hash id.
        tokenize: turns a text prompt or chat messages into token ids (None: text is an error).
    """
    if not isinstance(block_tokens, int) or block_tokens < 1:
        raise TraceFormatError(
            f"the trace block size must be an integer >= 1, got {block_tokens!r}"
        )
    options = TraceReadOptions(skip_bad_lines, block_tokens, tokenize)
    text = str(name_or_path)
    key = text.replace("-", "_")
    if key in BUNDLED_TRACES:
        return _read_file(TRACE_DIR / BUNDLED_TRACES[key], options, key, limit)
    if key == "synthetic" or key.startswith("synthetic:"):
        return _synthetic(text, limit)
    path = Path(text)
    if not path.is_file():
        names = ", ".join(list_bundled_traces())
        raise TraceFormatError(
            f"trace {text!r} is not a file nor a bundled trace ({names}, synthetic[:N[:SEED]])"
        )
    return _read_file(path, options, path.name, limit)


def _read_file(path: Path, options: TraceReadOptions, name: str, limit: int | None) -> Trace:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    kind = suffixes[-1] if suffixes else ""
    skip = options.skip_bad_lines
    if kind in (".jsonl", ".json"):
        return read_mooncake(
            path,
            skip_bad_lines=skip,
            name=name,
            limit=limit,
            block_tokens=options.block_tokens,
            tokenize=options.tokenize,
        )
    if kind == ".csv":
        return read_azure(path, skip_bad_lines=skip, name=name, limit=limit)
    raise TraceFormatError(f"{path}: unknown trace format (expected .jsonl, .json or .csv)")
