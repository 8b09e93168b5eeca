"""Trace file readers: Mooncake JSONL and Azure LLM inference CSV (plain or gzipped)."""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from pagedkv.errors import TraceFormatError
from pagedkv.sim.trace import Segment, Trace, TraceRequest, unique_segment_id

MOONCAKE_BLOCK_TOKENS = 512
_AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def open_text(path: Path) -> IO[str]:
    """Open a text file, decompressing ``.gz`` transparently."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _non_negative_int(record: dict[str, Any], field: str, minimum: int = 0) -> int:
    value = record.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"field {field!r} must be an integer >= {minimum}, got {value!r}")
    return value


def mooncake_request(
    record: Any, index: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> TraceRequest:
    """One Mooncake record -> request; hash ids become segments of ``block_tokens`` tokens.

    The last block is cut to the prompt length (it stays partial); hash ids short of the
    prompt length are padded with a per-request segment; extra ids are ignored.
    """
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    timestamp = record.get("timestamp", 0)
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool) or timestamp < 0:
        raise ValueError(f"field 'timestamp' must be a number >= 0, got {timestamp!r}")
    num_input = _non_negative_int(record, "input_length", 1)
    num_output = _non_negative_int(record, "output_length")
    hash_ids = record.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids
    ):
        raise ValueError("field 'hash_ids' must be a list of integers >= 0")
    segments: list[Segment] = []
    left = num_input
    for h in hash_ids:
        if left <= 0:
            break
        take = min(block_tokens, left)
        segments.append(Segment(h, take))
        left -= take
    if left > 0:
        segments.append(Segment(unique_segment_id(index, 1), left))
    output_id = unique_segment_id(index, 0)
    return TraceRequest(timestamp / 1000.0, tuple(segments), num_output, output_id)


def _parse_lines(
    lines: Iterator[tuple[int, str]],
    parse: Callable[[str, int], TraceRequest],
    source: str,
    skip_bad_lines: bool,
) -> tuple[list[TraceRequest], int]:
    requests: list[TraceRequest] = []
    skipped = 0
    for line_no, line in lines:
        if not line.strip():
            continue
        try:
            requests.append(parse(line, len(requests)))
        except (ValueError, msgspec.DecodeError) as exc:
            if not skip_bad_lines:
                raise TraceFormatError(f"{source}: line {line_no}: {exc}") from None
            skipped += 1
    return requests, skipped


def read_mooncake(
    path: str | Path,
    *,
    skip_bad_lines: bool = False,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    name: str | None = None,
) -> Trace:
    """Read a Mooncake JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``). Malformed lines raise TraceFormatError naming the file and line,
    or are skipped and counted with ``skip_bad_lines``."""
    path = Path(path)
    decode = msgspec.json.Decoder().decode

    def parse(line: str, index: int) -> TraceRequest:
        return mooncake_request(decode(line), index, block_tokens)

    with open_text(path) as f:
        requests, skipped = _parse_lines(enumerate(f, 1), parse, str(path), skip_bad_lines)
    return Trace(name or path.name, tuple(requests), skipped)


def _azure_time_s(text: str) -> float:
    stamp = text.strip()
    if not stamp:
        raise ValueError("empty TIMESTAMP")
    return datetime.fromisoformat(stamp).timestamp()


def read_azure(path: str | Path, *, skip_bad_lines: bool = False, name: str | None = None) -> Trace:
    """Read an Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Arrival times are seconds after the first row; every prompt is a unique segment."""
    path = Path(path)
    with open_text(path) as f:
        header = tuple(col.strip() for col in f.readline().split(","))
        if header != _AZURE_HEADER:
            raise TraceFormatError(f"{path}: line 1: expected header {','.join(_AZURE_HEADER)}")
        rows: list[tuple[float, int, int]] = []

        def parse(line: str, index: int) -> TraceRequest:
            cols = line.split(",")
            if len(cols) != 3:
                raise ValueError(f"expected 3 columns, got {len(cols)}")
            ctx, gen = int(cols[1]), int(cols[2])
            if ctx < 1 or gen < 0:
                raise ValueError(f"ContextTokens must be >= 1 and GeneratedTokens >= 0: {line!r}")
            rows.append((_azure_time_s(cols[0]), ctx, gen))
            seg = Segment(unique_segment_id(index, 1), ctx)
            return TraceRequest(0.0, (seg,), gen, unique_segment_id(index, 0))

        requests, skipped = _parse_lines(enumerate(f, 2), parse, str(path), skip_bad_lines)
    start = min((t for t, _, _ in rows), default=0.0)
    timed = tuple(
        req._replace(arrival_s=t - start) for req, (t, _, _) in zip(requests, rows, strict=True)
    )
    return Trace(name or path.name, timed, skipped)
