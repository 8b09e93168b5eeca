"""``pagedkv generate``: text, cache figures, --json, --verify, prompt files, errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.cli.app import main


@pytest.mark.slow
def test_json_output_with_verify(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello paged world\n\nhello paged cache\n")
    code = main(
        [
            *("generate", "Qwen3-8B", "--tiny", "--prompts-file", str(prompts)),
            *("--prompt", "hi", "--max-new-tokens", "5", "--json", "--verify"),
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["prompt"] for p in report["prompts"]] == [
        "hi",
        "hello paged world",
        "hello paged cache",
    ]
    assert all(len(p["token_ids"]) == 5 for p in report["prompts"])
    assert report["codec"] == "bytes"  # no tokenizer on disk: byte-level fallback
    assert report["prompts"][0]["prompt_token_ids"] == list(b"hi")
    assert report["verified"] is True
    assert report["cache"]["num_prompt_tokens"] == 2 + 17 + 17
    assert report["cache"]["max_blocks_used"] >= 2


@pytest.mark.slow
def test_text_output_prints_the_cache_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "gemma-3-27b-it", "--tiny", "--prompt", "hi"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("'hi' -> ")
    assert "cache: blocks used" in out and "preemptions 0" in out


@pytest.mark.slow
def test_verify_names_the_prompt_and_position(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pagedkv.hf.reference as reference

    real = reference.reference_tokens

    def off_by_one(model, prompt, max_new_tokens, attn_implementation="eager"):
        tokens = list(real(model, prompt, max_new_tokens, attn_implementation))
        if list(prompt) == list(b"bb"):
            tokens[2] = (tokens[2] + 1) % model.config.vocab_size
        return tuple(tokens)

    monkeypatch.setattr(reference, "reference_tokens", off_by_one)
    code = main(
        [
            *("generate", "Llama-3.1-8B", "--tiny", "--prompt", "aa", "--prompt", "bb"),
            *("--max-new-tokens", "4", "--verify"),
        ]
    )
    assert code == 1
    assert "prompt 1: generated token 2 differs" in capsys.readouterr().err


def test_a_config_without_weights_needs_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "Llama-3.1-8B", "--prompt", "hi"]) == 1
    assert "--tiny" in capsys.readouterr().err


def test_no_prompt_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "Llama-3.1-8B", "--tiny"]) == 1
    assert "--prompt" in capsys.readouterr().err


def test_a_local_model_directory_with_weights_and_tokenizer(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from pagedkv.hf.load import load_tiny_model

    load_tiny_model("Llama-3.1-8B", vocab_size=64, seed=3).save_pretrained(tmp_path)
    words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    words.train_from_iterator(["hello paged world of cache blocks"], trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(
        tmp_path
    )
    code = main(
        [
            *("generate", str(tmp_path), "--prompt", "hello paged world"),
            *("--max-new-tokens", "3", "--json", "--verify"),
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["codec"] == "tokenizer"
    assert report["verified"] is True
    (prompt,) = report["prompts"]
    assert len(prompt["prompt_token_ids"]) == 3  # three words, not 17 bytes
    assert len(prompt["token_ids"]) == 3


@pytest.mark.slow
def test_prompts_file_lines_end_only_at_newlines(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    """U+2028, U+0085, form feed and vertical tab are text inside a prompt, not line ends."""
    from pagedkv.cli.generate import prompt_lines

    inside = "a\u2028b\x85c\x0cd\x0be"
    assert prompt_lines(f"{inside}\r\nsecond\n\n  \nthird") == [inside, "second", "third"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{inside}\nsecond\n", encoding="utf-8")
    code = main(
        [
            *("generate", "Llama-3.1-8B", "--tiny", "--prompts-file", str(prompts)),
            *("--max-new-tokens", "2", "--json"),
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["prompt"] for p in report["prompts"]] == [inside, "second"]
    assert report["prompts"][0]["prompt_token_ids"] == list(inside.encode("utf-8"))


def test_an_empty_prompt_is_an_error_not_token_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "Llama-3.1-8B", "--tiny", "--prompt", "hi", "--prompt", ""]) == 1
    assert "--prompt number 2 is empty" in capsys.readouterr().err
