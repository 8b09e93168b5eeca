"""Every bad input of issue 11: one line on stderr, exit 2 (usage) or 1 (input), no output."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pagedkv.cli.app import main
from pagedkv.models import load_model_config

LLAMA = load_model_config("Llama-3.1-8B").raw
SIM = ["simulate", "Llama-3.1-8B", "--num-blocks", "400"]


@pytest.fixture(autouse=True)
def _no_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")


def fails(capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str) -> str:
    assert main(args) == code
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.err
    assert lines[0].startswith("error: ") and "Traceback" not in out.err
    assert out.out == ""
    return lines[0]


def config(tmp_path: Path, name: str, **changes: object) -> str:
    data = {k: v for k, v in {**LLAMA, **changes}.items() if v is not None}
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(data))
    return str(path)


# --- model configs ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("field", ["num_hidden_layers", "vocab_size"])
@pytest.mark.parametrize("transformers", ["0", "1"])
def test_missing_fields_take_the_class_defaults(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    transformers: str,
) -> None:
    # As transformers reads the file: LlamaConfig's default, named in the plan.
    if transformers == "1":
        pytest.importorskip("transformers")
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", transformers)
    model = config(tmp_path, "m", **{field: None})
    assert main(["plan", model, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert field in data["config_defaults"]["fields"]


@pytest.mark.parametrize("field", ["num_hidden_layers", "vocab_size"])
@pytest.mark.parametrize("transformers", ["0", "1"])
def test_missing_fields_of_an_unknown_model_type_are_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    transformers: str,
) -> None:
    if transformers == "1":
        pytest.importorskip("transformers")
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", transformers)
    model = config(tmp_path, "m", **{field: None, "model_type": "llama_fork"})
    fails(capsys, ["plan", model], 1, f"config field '{field}' is missing")


@pytest.mark.parametrize("kv_heads", [5, 64])
def test_kv_heads_must_divide_query_heads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kv_heads: int
) -> None:
    model = config(tmp_path, "m", num_key_value_heads=kv_heads)
    fails(capsys, ["plan", model], 1, f"num_key_value_heads ({kv_heads}) must divide")


def test_a_billion_layers_is_refused_before_building_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = config(tmp_path, "m", num_hidden_layers=1e9)
    fails(capsys, ["plan", model], 1, "'num_hidden_layers' is 1,000,000,000")


def test_non_utf8_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "llama", "name": "\xff\xfe"}')
    fails(capsys, ["plan", str(path)], 1, "is not UTF-8 text")


def test_deeply_nested_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    fails(capsys, ["plan", str(path)], 1, "nested too deeply")


# --- plan flags --------------------------------------------------------------------


@pytest.mark.slow
def test_max_model_len_above_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    fails(capsys, ["plan", "Llama-3.1-8B", "--max-model-len", "200k"], 1,
          "is above Llama-3.1-8B's limit of 131,072 tokens")  # fmt: skip
    fails(capsys, [*SIM, "--max-model-len", "1M"], 1, "is above Llama-3.1-8B's limit")


def test_huge_kv_cache_memory(capsys: pytest.CaptureFixture[str]) -> None:
    fails(capsys, ["plan", "--kv-cache-memory", "1e400"], 1, "size must be between 1 byte")


# --- simulate sizes ------------------------------------------------------------------


def test_two_blocks_cannot_replay_anything(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "Llama-3.1-8B", "--num-blocks", "2", "--trace", "synthetic:5:1"]
    fails(capsys, args, 1, "--num-blocks 2 holds requests of fewer than 16 tokens")


def test_a_trillion_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    fails(capsys, ["simulate", "--num-blocks", "1e12"], 2, "'--num-blocks'")
    fails(capsys, ["simulate", "--num-blocks", str(10**12)], 1, "is more than 16,777,216 blocks")


def test_synthetic_is_generated_lazily(capsys: pytest.CaptureFixture[str]) -> None:
    # A billion requests built eagerly would exhaust memory; lazily, ten are read.
    assert main([*SIM, "--trace", "synthetic:1e9", "--limit", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 10
    fails(capsys, [*SIM, "--trace", "synthetic:1e9", "--limit", "0"], 1, "would not fit in memory")


def test_steps_csv_into_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "nope" / "steps.csv"
    fails(capsys, [*SIM, "--steps-csv", str(target)], 1, "--steps-csv: directory")


def test_plot_into_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = str(tmp_path / "nope" / "x.png")
    for args in ([*SIM, "--sweep", "--plot", target], ["plan", "--plot", target]):
        fails(capsys, args, 1, f"--plot: directory {str(tmp_path / 'nope')!r} does not exist")


def test_plot_without_matplotlib_fails_before_the_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    _no_work(monkeypatch)
    fails(capsys, [*SIM, "--sweep", "--plot", "x.png"], 1, "--plot needs matplotlib")
    fails(capsys, ["plan", "--plot", "x.png"], 1, "--plot needs matplotlib")


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make reading a model (simulate) or planning one (plan) fail the test."""
    import pagedkv.deployment
    import pagedkv.models

    def work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command started its work before checking its options")

    monkeypatch.setattr(pagedkv.models, "load_model_config", work)
    monkeypatch.setattr(pagedkv.deployment, "plan_model", work)


def test_steps_csv_with_replicas_fails_before_the_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_work(monkeypatch)
    args = [*SIM, "--replicas", "2", "--steps-csv", "x.csv"]
    fails(capsys, args, 1, "--steps-csv records one engine; it does not go with --replicas")


def test_gpu_with_num_blocks_fails_before_the_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_work(monkeypatch)
    fails(capsys, [*SIM, "--gpu", "H100-80GB"], 1, "--gpu and --num-blocks are alternatives")
    too_many = ["simulate", "--num-blocks", str(10**12)]
    fails(capsys, too_many, 1, "is more than 16,777,216 blocks")


# --- traces --------------------------------------------------------------------------


def _gz(path: Path, data: bytes) -> str:
    path.write_bytes(gzip.compress(data))
    return str(path)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", b"", "no requests in this trace (the file is empty)"),
        ("blank.jsonl", b"\n  \n\n", "no requests in this trace (it holds only blank lines)"),
        ("header.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n", "holds only the header"),
        ("empty.csv", b"", "no requests in this trace (the file is empty)"),
        ("binary.jsonl", bytes(range(128, 256)) * 4, "not UTF-8 text at byte 0"),
        ("plain.jsonl.gz", b'{"input_length": 5}\n', "not a gzip file"),
    ],
)
def test_bad_trace_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    fails(capsys, [*SIM, "--trace", str(path)], 1, message)


def test_empty_and_truncated_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = _gz(tmp_path / "empty.jsonl.gz", b"")
    fails(capsys, [*SIM, "--trace", empty], 1, "(the file is empty)")
    line = json.dumps({"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1]})
    whole = gzip.compress((line + "\n").encode() * 200)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    fails(capsys, [*SIM, "--trace", str(cut)], 1, "the gzip data is truncated")


def test_all_lines_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n{}\n")
    fails(capsys, [*SIM, "--trace", str(path), "--skip-bad-lines"], 1,
          "all 2 lines were malformed and skipped")  # fmt: skip


# --- what simulate shows -------------------------------------------------------------------


def test_rejected_requests_are_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SIM, "--trace", "synthetic:20:1", "--max-model-len", "2048"]
    assert main(args) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "rejected (prompt >= max_model_len)" in line)
    rejected = int(row.split("│")[2].strip().replace(",", ""))
    assert rejected > 0
    assert f"note: {rejected:,} requests were rejected" in out.replace("\n", " ")
    assert "None calls/s" not in out


def test_azure_trace_explains_its_zero_hit_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--trace", "azure_conv", "--limit", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hit_rate"] == 0.0
    assert any("no prefix-cache hit is possible" in note for note in data["notes"])
