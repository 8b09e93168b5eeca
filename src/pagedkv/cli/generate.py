"""``pagedkv generate``: run a transformers model on a pagedkv cache and print the text
with the cache figures; ``--verify`` checks every token against ``generate()``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from pagedkv.cli.common import (
    BLOCK_SIZE_OPTION,
    JSON_OPTION,
    PREFIX_CACHING_OPTION,
    parse_bytes,
    stderr_console,
    stdout_console,
)
from pagedkv.errors import ConfigError

__all__ = [
    "PROMPT_OPTION",
    "PROMPTS_FILE_OPTION",
    "prompt_lines",
    "generate_command",
]

PROMPT_OPTION = typer.Option([], "--prompt", help="A prompt (repeatable).")
PROMPTS_FILE_OPTION = typer.Option(None, "--prompts-file", help="A file with one prompt per line.")


def prompt_lines(text: str) -> list[str]:
    """One prompt per line: lines end at ``\n`` (or ``\r\n``) only, so a prompt may hold
    any other separator (U+2028, U+0085, form feed, vertical tab); blank lines are skipped."""
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    return [line for line in lines if line.strip()]


def _read_prompts(prompts: list[str], prompts_file: Path | None) -> list[str]:
    for position, text in enumerate(prompts, start=1):
        if not text:
            raise ConfigError(f"--prompt number {position} is empty; give it some text")
    texts = list(prompts)
    if prompts_file is not None:
        try:
            content = prompts_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--prompts-file: cannot read {prompts_file}: {exc}") from None
        texts += prompt_lines(content)
    if not texts:
        raise ConfigError("give at least one --prompt or a --prompts-file with prompts")
    return texts


def _load(model: str, tiny: bool, seed: int) -> Any:
    from pagedkv.hf.load import load_pretrained, load_tiny_model, use_one_thread

    if tiny:
        use_one_thread()
        return load_tiny_model(model, seed=seed)
    if not Path(model).is_dir():
        raise ConfigError(
            f"{model}: not a local model directory; pass --tiny to run its config with "
            "seeded random weights (no download is attempted)"
        )
    return load_pretrained(model)


def generate_command(
    model: str = typer.Argument(
        ..., help="Model directory with weights, or any config with --tiny."
    ),
    prompt: list[str] = PROMPT_OPTION,
    prompts_file: Path | None = PROMPTS_FILE_OPTION,
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", min=1),
    kv_cache_memory_bytes: str = typer.Option(
        "64MiB", "--kv-cache-memory-bytes", help="KV cache size, e.g. 64MiB."
    ),
    max_num_seqs: int = typer.Option(8, "--max-num-seqs", min=1),
    max_num_batched_tokens: int = typer.Option(256, "--max-num-batched-tokens", min=1),
    block_size: int = BLOCK_SIZE_OPTION,
    prefix_caching: bool | None = PREFIX_CACHING_OPTION,
    tiny: bool = typer.Option(
        False, "--tiny", help="Shrink MODEL's config (same layer pattern), seeded random weights."
    ),
    seed: int = typer.Option(0, "--seed", help="Weight seed with --tiny."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Also run transformers' generate() per prompt; exit 1 on a difference.",
    ),
    json_output: bool = JSON_OPTION,
) -> int:
    """Generate greedily through pagedkv's plan, block tables and tensors.
    \f
    Args:
        max_new_tokens: tokens generated per prompt (fewer where an EOS token comes first).
        max_num_seqs: requests running at once.
        max_num_batched_tokens: tokens scheduled per step.
    """
    from pagedkv.hf import PagedGenerator
    from pagedkv.hf.reference import first_mismatch
    from pagedkv.hf.text import text_codec

    texts = _read_prompts(prompt, prompts_file)
    hf_model = _load(model, tiny, seed)
    codec = text_codec(model, int(hf_model.config.vocab_size))
    prompt_ids = [codec.encode(text) for text in texts]
    for text, ids in zip(texts, prompt_ids):
        if not ids:
            raise ConfigError(f"prompt {text!r} encodes to no tokens with the {codec.name} codec")
    engine = PagedGenerator(
        hf_model,
        kv_cache_memory_bytes=parse_bytes(kv_cache_memory_bytes, "--kv-cache-memory-bytes"),
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=prefix_caching is not False,
    )
    output = engine.generate(prompt_ids, max_new_tokens)
    rope = engine.rope_rule()
    reference = "transformers' generate()" + (f" with {rope.describe()}" if rope else "")
    mismatch = (
        first_mismatch(hf_model, prompt_ids, output.token_ids, max_new_tokens, rope)
        if verify
        else None
    )
    if json_output:
        report = {
            "model": model,
            "tiny": tiny,
            "codec": codec.name,
            "prompts": [
                {
                    "prompt": t,
                    "prompt_token_ids": p,
                    "token_ids": list(o),
                    "text": codec.decode(list(o)),
                }
                for t, p, o in zip(texts, prompt_ids, output.token_ids)
            ],
            "cache": output.figures.as_dict(),
            "verified": None if not verify else mismatch is None,
            "reference": reference if verify else None,
        }
        typer.echo(json.dumps(report, indent=2))
    else:
        console = stdout_console()
        for text, tokens in zip(texts, output.token_ids):
            console.print(f"{text!r} -> {codec.decode(list(tokens))!r}", markup=False)
        console.print(f"cache: {output.figures.line()}", markup=False)
        if verify and mismatch is None:
            console.print(f"verify: every token matches {reference}", markup=False)
    if mismatch is not None:
        stderr_console().print(
            f"verify failed against {reference}: {mismatch.describe()}", markup=False
        )
        return 1
    return 0
