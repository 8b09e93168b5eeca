from __future__ import annotations

import gzip
import json

import pytest

from pagedkv.errors import ConfigError, TraceFormatError
from pagedkv.sim.traces.bundled import list_bundled_traces, load_trace
from pagedkv.sim.traces.readers import read_azure, read_mooncake
from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace
from pagedkv.sim.traces.tokens import output_tokens, prompt_tokens, segment_tokens
from pagedkv.sim.traces.trace import Segment


def _jsonl(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_mooncake_blocks_become_segments_and_last_block_stays_partial(tmp_path):
    path = _jsonl(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 1500, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]},
        ],
    )
    trace = read_mooncake(path)
    first, second = trace.requests
    assert first.segments == (Segment(7, 512), Segment(8, 512), Segment(9, 76))
    assert second.segments == (Segment(7, 512), Segment(8, 88))
    assert second.arrival_s == 1.5
    assert (first.num_prompt_tokens, second.num_prompt_tokens) == (1100, 600)
    a, b = prompt_tokens(first), prompt_tokens(second)
    assert len(a) == 1100 and len(b) == 600
    assert a[:600] == b  # equal ids give equal tokens, the partial block is a prefix
    assert first.output_segment_id != second.output_segment_id
    assert output_tokens(first) != output_tokens(second)[:1] * 5


def test_mooncake_short_hash_ids_are_padded_with_unique_tokens(tmp_path):
    path = _jsonl(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 700, "output_length": 1, "hash_ids": [1]},
            {"timestamp": 0, "input_length": 700, "output_length": 1, "hash_ids": [1]},
        ],
    )
    a, b = (prompt_tokens(r) for r in read_mooncake(path).requests)
    assert a[:512] == b[:512] and a[512:] != b[512:]


def test_segment_tokens_are_deterministic_prefixes():
    assert segment_tokens(5, 40)[:10] == segment_tokens(5, 10)
    assert segment_tokens(5, 10) != segment_tokens(6, 10)
    assert segment_tokens(-3, 3) == segment_tokens(-3, 3)
    assert all(0 <= t < 1 << 16 for t in segment_tokens(9, 1000))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "line 2"),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": []}', "input_length"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}', "input_length"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1}', "timestamp"),
        ('{"input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}', "hash_ids"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_mooncake_malformed_line_names_file_and_line(tmp_path, bad, message):
    good = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}
    path = _jsonl(tmp_path, [good, bad, good])
    with pytest.raises(TraceFormatError, match=message) as info:
        read_mooncake(path)
    assert "t.jsonl: line 2" in str(info.value)
    trace = read_mooncake(path, skip_bad_lines=True)
    assert len(trace.requests) == 2 and trace.num_skipped_lines == 1


def test_blank_lines_are_not_errors(tmp_path):
    path = _jsonl(tmp_path, ['{"input_length": 3, "output_length": 1}', "", "  "])
    trace = read_mooncake(path)
    assert len(trace.requests) == 1 and trace.num_skipped_lines == 0


def test_gzip_is_read_transparently(tmp_path):
    row = {"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [4]}
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(row) + "\n")
    (req,) = load_trace(path).requests
    assert req.segments == (Segment(4, 3),) and req.num_output_tokens == 2


def test_azure_csv(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        "2023-11-16 18:15:46.6805900,374,44\r\n"
        "2023-11-16 18:15:50.9951690,396,109\r\n"
        "2023-11-16 18:15:51,bad,1\r\n"
    )
    with pytest.raises(TraceFormatError, match=r"a\.csv: line 4"):
        read_azure(path)
    trace = read_azure(path, skip_bad_lines=True)
    assert trace.num_skipped_lines == 1
    first, second = trace.requests
    assert first.arrival_s == 0.0
    assert second.arrival_s == pytest.approx(4.314579)
    assert (first.num_prompt_tokens, first.num_output_tokens) == (374, 44)
    assert prompt_tokens(first)[:300] != prompt_tokens(second)[:300]


def test_azure_bad_header(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("time,ctx,gen\n1,2,3\n")
    with pytest.raises(TraceFormatError, match="line 1"):
        read_azure(path)


@pytest.mark.slow
def test_bundled_traces_load():
    assert list_bundled_traces() == ["azure_code", "azure_conv", "mooncake_conversation"]
    trace = load_trace("mooncake-conversation")
    assert len(trace.requests) == 6016
    assert trace.num_prompt_tokens == 76_879_122
    assert len(load_trace("azure_code").requests) == 8819


def test_unknown_trace_and_format(tmp_path):
    with pytest.raises(TraceFormatError, match="not a file nor a bundled trace"):
        load_trace("no-such-trace")
    other = tmp_path / "x.txt"
    other.write_text("1\n")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        load_trace(other)
    with pytest.raises(TraceFormatError, match="synthetic"):
        load_trace("synthetic:x")


def test_synthetic_is_seeded_and_shares_prefixes():
    cfg = SyntheticTraceConfig(num_requests=300, seed=3)
    trace = synthetic_trace(cfg)
    assert trace == synthetic_trace(cfg)
    assert trace != synthetic_trace(SyntheticTraceConfig(num_requests=300, seed=4))
    assert load_trace("synthetic:300:3").requests == trace.requests
    requests = trace.requests
    assert all(r.num_prompt_tokens <= cfg.max_prompt_tokens for r in requests)
    firsts = [r.segments[0].segment_id for r in requests]
    # Zipf: the most popular system prompt opens far more requests than 1/20 of them
    assert max(firsts.count(s) for s in set(firsts)) > len(requests) / 10
    # a follow-up turn extends an earlier request's prompt plus that request's output
    earlier = {(r.segments, r.output_segment_id, r.num_output_tokens) for r in requests}
    follow_ups = [
        r
        for r in requests
        if len(r.segments) >= 3
        and (r.segments[:-2], r.segments[-2].segment_id, r.segments[-2].num_tokens) in earlier
    ]
    assert follow_ups


def test_synthetic_config_errors():
    with pytest.raises(ConfigError, match="num_requests"):
        SyntheticTraceConfig(num_requests=0)
    with pytest.raises(ConfigError, match="user_tokens"):
        SyntheticTraceConfig(user_tokens=(5, 2))
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        SyntheticTraceConfig(max_prompt_tokens=100)
