"""What a trace holds reaches the replay as the user meant: hash-id block size, token
ids, text prompts and chat messages, how much of the trace was replayed."""

from __future__ import annotations

import builtins
import gzip
import json
from pathlib import Path

import pytest

from pagedkv.errors import ConfigError, TraceFormatError
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.traces.bundled import load_trace
from pagedkv.sim.traces.readers import read_mooncake
from pagedkv.sim.traces.tokens import prompt_tokens

from .helpers import make_setup


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _hashed_on_16(num_requests: int = 6) -> list[dict]:
    # every prompt: 700 tokens = 44 ids of 16-token blocks; they share their first 20 ids
    out = []
    for i in range(num_requests):
        ids = list(range(20)) + [1000 * (i + 1) + k for k in range(24)]
        out.append({"timestamp": i, "input_length": 700, "output_length": 2, "hash_ids": ids})
    return out


def test_hash_ids_too_many_for_the_block_size_are_refused_with_the_likely_size(tmp_path):
    path = _write(tmp_path / "t16.jsonl", _hashed_on_16())
    with pytest.raises(TraceFormatError) as err:
        read_mooncake(path)  # 512-token blocks: 700 tokens have at most 2 ids
    text = str(err.value)
    assert "44 ids for a 700-token prompt" in text and "--trace-block-size 16" in text
    assert "6 of 6 records" in text


def test_the_trace_block_size_option_reads_hash_ids_as_that_many_tokens(tmp_path):
    path = _write(tmp_path / "t16.jsonl", _hashed_on_16())
    trace = load_trace(path, block_tokens=16)
    assert [seg.num_tokens for seg in trace.requests[0].segments][:3] == [16, 16, 16]
    assert trace.requests[0].num_prompt_tokens == 700
    # shared: 20 ids x 16 tokens = 320 tokens, not 20 x 512
    a, b = (prompt_tokens(r) for r in trace.requests[:2])
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    assert shared == 320
    setup = make_setup(4096, max_model_len=1024)
    res = setup.simulator(SchedulerSettings(max_num_seqs=1)).run(trace)
    # 5 of 6 requests hit the 320 shared tokens (block size 4: all 80 blocks)
    assert res.hit_tokens == 5 * 320


def test_token_id_records_share_exactly_their_common_prefix(tmp_path):
    base = list(range(100, 140))  # 40 tokens
    records = [
        {"token_ids": [*base, 1, 2, 3, 4, 5, 6, 7, 8], "output_length": 2},
        {"prompt_token_ids": base + [9] * 10, "max_tokens": 3, "timestamp": 5},
    ]
    trace = load_trace(_write(tmp_path / "ids.jsonl", records))
    first, second = trace.requests
    assert prompt_tokens(first) == records[0]["token_ids"]
    assert prompt_tokens(second) == records[1]["prompt_token_ids"]
    assert (second.num_output_tokens, second.arrival_s) == (3, 0.005)
    res = make_setup(256).simulator(SchedulerSettings(max_num_seqs=1)).run(trace)
    assert res.hit_tokens == 40  # 10 blocks of 4 tokens: the common prefix exactly


def test_token_id_records_can_be_gzipped_and_mixed_with_mooncake_records(tmp_path):
    path = tmp_path / "mixed.jsonl.gz"
    lines = [
        {"token_ids": [5] * 30, "output_length": 1},
        {"input_length": 20, "output_length": 1, "hash_ids": [7]},
    ]
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in lines))
    trace = load_trace(path)
    assert [r.num_prompt_tokens for r in trace.requests] == [30, 20]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"token_ids": [1, -2], "output_length": 1}, "'token_ids' must be a list"),
        ({"token_ids": [1, 2]}, "output length"),
        ({"token_ids": [], "output_length": 1}, "empty"),
        ({"prompt": "hi", "output_length": 1}, "needs the model's tokenizer"),
        ({"messages": "hi", "output_length": 1}, "'messages' must be a list"),
    ],
)
def test_bad_prompt_records_name_file_line_and_field(tmp_path, record, message):
    path = _write(tmp_path / "bad.jsonl", [{"token_ids": [1], "output_length": 1}, record])
    with pytest.raises(TraceFormatError, match=rf"bad.jsonl: line 2: .*{message}"):
        load_trace(path)


def _tiny_tokenizer_dir(tmp_path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    words = ["[UNK]", "<s>", "hello", "world", "again", "user", "assistant", ":", "|"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} | {% endfor %}"
        "{% if add_generation_prompt %}assistant :{% endif %}"
    )
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_text_prompts_and_chat_messages_are_tokenized_by_the_model_tokenizer(tmp_path):
    from pagedkv.models.tokenizer import TextTokenizer

    tokenize = TextTokenizer(_tiny_tokenizer_dir(tmp_path))
    records = [
        {"prompt": "hello world hello world", "output_length": 1},
        {"messages": [{"role": "user", "content": "hello world"}], "output_length": 1},
    ]
    trace = load_trace(_write(tmp_path / "text.jsonl", records), tokenize=tokenize)
    assert prompt_tokens(trace.requests[0]) == [2, 3, 2, 3]
    # "user : hello world | assistant :"
    assert prompt_tokens(trace.requests[1]) == [5, 7, 2, 3, 8, 6, 7]


def test_text_prompts_without_transformers_are_a_clear_error(tmp_path, monkeypatch):
    from pagedkv.models.tokenizer import TextTokenizer

    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name.startswith("transformers"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    path = _write(tmp_path / "text.jsonl", [{"prompt": "hello", "output_length": 1}])
    with pytest.raises(ConfigError, match=r"needs transformers.*token_ids"):
        load_trace(path, tokenize=TextTokenizer(tmp_path))


def test_a_limit_keeps_count_of_the_whole_trace():
    cut = load_trace("mooncake_conversation", limit=10)
    assert len(cut.requests) == 10 and cut.total_requests == 6016
    assert load_trace("synthetic:50:1", limit=10).total_requests == 50
    assert load_trace("synthetic:50:1").total_requests == 50
    cut = load_trace("synthetic:50:1", limit=7)
    res = make_setup(4096).simulator(SchedulerSettings()).run(cut)
    rows = dict(res.summary_rows())
    assert rows["replayed of the trace"] == "7 of 50 requests"
