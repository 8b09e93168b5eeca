"""The loop in docs/engine-integration.md (its ``py`` blocks) runs as written and
generates what ``generate()`` does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.hf.reference import reference_tokens

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine-integration.md"


def test_the_documented_loop_is_token_identical(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"^```py\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert blocks
    namespace: dict[str, object] = {"__name__": "engine_integration_hf_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert "hit tokens" in capsys.readouterr().out
    scheduler, model, prompts = namespace["scheduler"], namespace["model"], namespace["prompts"]
    assert scheduler.num_hit_tokens >= 64  # type: ignore[attr-defined]
    for i, prompt in enumerate(prompts):  # type: ignore[arg-type]
        expected = reference_tokens(model, prompt, 8)
        assert tuple(scheduler.generated[f"r{i}"]) == expected  # type: ignore[attr-defined]
