"""Trace file readers: JSONL (Mooncake hash ids, token ids, text prompts, chat messages)
and Azure LLM inference CSV, plain or gzipped."""

from __future__ import annotations

import gzip
import io
import math
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from pagedkv.errors import ConfigError, TraceFormatError
from pagedkv.sim.traces.token_records import TEXT_FIELDS, TOKEN_FIELDS, ChunkTable, token_request
from pagedkv.sim.traces.trace import Segment, Trace, TraceRequest, unique_segment_id

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "open_text",
    "mooncake_request",
    "HashBlockCheck",
    "read_mooncake",
    "read_azure",
]

MOONCAKE_BLOCK_TOKENS = 512
_AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def open_text(path: Path) -> IO[str]:
    """Open a text file, decompressing ``.gz`` transparently."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


@contextmanager
def _readable(path: Path) -> Iterator[None]:
    """Turn what a broken file raises while it is read into one TraceFormatError."""
    try:
        yield
    except gzip.BadGzipFile:
        raise TraceFormatError(f"{path}: not a gzip file, though its name ends in .gz") from None
    except EOFError:
        raise TraceFormatError(
            f"{path}: the gzip data is truncated (the file ends inside the compressed stream)"
        ) from None
    except zlib.error as exc:
        raise TraceFormatError(f"{path}: corrupt gzip data ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            f"{path}: not UTF-8 text at byte {exc.start} (a binary file?); traces are "
            "JSONL or CSV text, optionally gzipped"
        ) from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _no_requests(path: Path, num_lines: int, skipped: int, what: str) -> TraceFormatError:
    if skipped:
        why = f"all {skipped} lines were malformed and skipped"
    elif num_lines:
        why = f"it holds only {what}"
    else:
        why = "the file is empty"
    return TraceFormatError(f"{path}: no requests in this trace ({why})")


def _non_negative_int(record: dict[str, Any], field: str, minimum: int = 0) -> int:
    value = record.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"field {field!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _arrival_s(record: dict[str, Any]) -> float:
    timestamp = record.get("timestamp", 0)
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool) or timestamp < 0:
        raise ValueError(f"field 'timestamp' must be a number >= 0, got {timestamp!r}")
    return timestamp / 1000.0


def _priority(record: dict[str, Any]) -> int:
    value = record.get("priority", 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field 'priority' must be an integer, got {value!r}")
    return value


def mooncake_request(
    record: Any, index: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> TraceRequest:
    """One Mooncake record -> request; hash ids become segments of ``block_tokens`` tokens.

    The last block is cut to the prompt length (it stays partial); hash ids short of the
    prompt length are padded with a per-request segment; extra ids are ignored (the
    reader refuses a trace where they occur: see ``HashBlockCheck``).
    """
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    arrival_s = _arrival_s(record)
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
    return TraceRequest(arrival_s, tuple(segments), num_output, output_id, _priority(record))


class HashBlockCheck:
    """Whether a trace's hash ids fit the block size the reader was told.

    A Mooncake record has one hash id per ``block_tokens`` tokens of its prompt (the
    last block partial): ``ceil(input_length / block_tokens)`` ids. More ids than that
    cannot be: the trace was hashed on smaller blocks, and reading it on larger ones
    would make every hash stand for far more shared tokens than it does.
    """

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.num_records = self.num_too_many = self.num_too_few = 0
        self.example: tuple[int, int, int] | None = None  # (line, ids, input_length)
        self.tokens_per_id: list[float] = []

    def add(self, line_no: int, record: Any) -> None:
        if not isinstance(record, dict) or not isinstance(record.get("hash_ids"), list):
            return
        num_ids = len(record["hash_ids"])
        num_input = record.get("input_length")
        if not isinstance(num_input, int) or num_input < 1 or not num_ids:
            return
        self.num_records += 1
        expected = -(-num_input // self.block_tokens)
        if num_ids > expected:
            self.num_too_many += 1
            self.tokens_per_id.append(num_input / num_ids)
            if self.example is None:
                self.example = (line_no, num_ids, num_input)
        elif num_ids < expected:
            self.num_too_few += 1

    def suggested_block_tokens(self) -> int:
        """The power of two nearest the median prompt tokens per hash id."""
        ratios = sorted(self.tokens_per_id)
        median = ratios[len(ratios) // 2] if ratios else float(self.block_tokens)
        return 1 << round(math.log2(median)) if median >= 1 else 1

    def error(self, source: str) -> TraceFormatError | None:
        if not self.num_too_many or self.example is None:
            return None
        line_no, num_ids, num_input = self.example
        suggested = self.suggested_block_tokens()
        return TraceFormatError(
            f"{source}: {self.num_too_many:,} of {self.num_records:,} records have more hash "
            f"ids than {self.block_tokens}-token blocks allow (line {line_no}: {num_ids} ids "
            f"for a {num_input:,}-token prompt, at most {-(-num_input // self.block_tokens)}); "
            f"the trace was hashed on smaller blocks, about {suggested} tokens each: give "
            f"--trace-block-size {suggested} (or the size the trace was made with)"
        )


def _parse_lines(
    lines: Iterator[tuple[int, str]],
    parse: Callable[[str, int], TraceRequest],
    source: str,
    skip_bad_lines: bool,
    limit: int | None = None,
    rest: list[int] | None = None,
) -> tuple[list[TraceRequest], int]:
    """Parse every line; with ``limit``, lines past it are only counted into ``rest[0]``."""
    rest = rest if rest is not None else [0]
    requests: list[TraceRequest] = []
    skipped = 0
    for line_no, line in lines:
        if limit is not None and len(requests) >= limit:
            if line.strip():
                rest[0] += 1
            continue
        if not line.strip():
            continue
        try:
            requests.append(parse(line, len(requests)))
        except ConfigError:
            raise  # not the line's fault (no tokenizer): stop, do not skip
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
    limit: int | None = None,
    tokenize: Callable[[Any], list[int]] | None = None,
) -> Trace:
    """Read a JSONL trace. Each line is a Mooncake record (``timestamp`` ms,
    ``input_length``, ``output_length``, ``hash_ids`` of ``block_tokens``-token blocks)
    or a record with its prompt (``token_ids``, or ``prompt`` / ``messages`` that
    ``tokenize`` turns into ids; see :mod:`pagedkv.sim.traces.token_records`).

    Malformed lines raise TraceFormatError naming the file and line, or are skipped and
    counted with ``skip_bad_lines``; hash ids that do not fit ``block_tokens`` are an
    error (the trace was hashed on other blocks). Only the first ``limit`` requests are
    parsed (the rest are counted). A file without requests is an error.

    Args:
        path: the JSONL file (optionally gzipped).
        skip_bad_lines: skip and count malformed lines instead of raising.
        block_tokens: tokens per Mooncake hash id.
        name: the trace's name (None: the file name).
        limit: requests parsed (None: all).
        tokenize: turns a text prompt or chat messages into token ids (None: text is an error).
    """
    path = Path(path)
    decode = msgspec.json.Decoder().decode
    lines = [0]
    check = HashBlockCheck(block_tokens)
    chunks = ChunkTable()

    def parse(line: str, index: int) -> TraceRequest:
        record = decode(line)
        if isinstance(record, dict) and any(f in record for f in (*TOKEN_FIELDS, *TEXT_FIELDS)):
            arrival_s, priority = _arrival_s(record), _priority(record)
            return token_request(record, index, chunks, tokenize, arrival_s, priority)
        request = mooncake_request(record, index, block_tokens)
        check.add(lines[0], record)
        return request

    def numbered(f: IO[str]) -> Iterator[tuple[int, str]]:
        for lines[0], line in enumerate(f, 1):
            yield lines[0], line

    rest = [0]
    with _readable(path), open_text(path) as f:
        requests, skipped = _parse_lines(numbered(f), parse, str(path), skip_bad_lines, limit, rest)
    error = check.error(str(path))
    if error is not None:
        raise error
    if not requests and limit != 0:
        raise _no_requests(path, lines[0], skipped, "blank lines")
    return Trace(name or path.name, tuple(requests), skipped, len(requests) + rest[0])


def _azure_time_s(text: str) -> float:
    stamp = text.strip()
    if not stamp:
        raise ValueError("empty TIMESTAMP")
    return datetime.fromisoformat(stamp).timestamp()


def read_azure(
    path: str | Path,
    *,
    skip_bad_lines: bool = False,
    name: str | None = None,
    limit: int | None = None,
) -> Trace:
    """Read an Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Arrival times are seconds after the first row; every prompt is a unique segment
    (the file has token counts, not content, so no two prompts share a prefix).

    Args:
        path: the CSV file (optionally gzipped).
        skip_bad_lines: skip and count malformed lines instead of raising.
        name: the trace's name (None: the file name).
        limit: requests parsed (None: all).
    """
    path = Path(path)
    with _readable(path), open_text(path) as f:
        first = f.readline()
        if not first.strip():
            raise _no_requests(path, 1 if first else 0, 0, "blank lines")
        header = tuple(col.strip() for col in first.split(","))
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

        rest = [0]
        requests, skipped = _parse_lines(
            enumerate(f, 2), parse, str(path), skip_bad_lines, limit, rest
        )
    if not requests and limit != 0:
        raise _no_requests(path, 1, skipped, "the header")
    start = min((t for t, _, _ in rows), default=0.0)
    timed = tuple(
        req._replace(arrival_s=t - start) for req, (t, _, _) in zip(requests, rows, strict=True)
    )
    return Trace(name or path.name, timed, skipped, len(timed) + rest[0])
