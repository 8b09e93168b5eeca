"""Mamba hybrids through pagedkv. Each state layer's conv and recurrent states are read
from and written to the request's state blocks; with prefix caching on (vLLM's "align"
mode) every block boundary holds a checkpoint, so later requests start from a cached
state, and preempted requests recompute.

- granite-4.0-h: Mamba-2 mixers and full attention (ten Mamba layers, then the first
  attention layer, as in the real config). ``mamba_d_state`` is shrunk from 128 to 8 so
  the aligned block is 48 tokens, not 560, and short prompts cross checkpoints.
- Nemotron-H: Mamba-2, attention and MLP-only layers (``ssm_state_size`` 8, real 256).
- Qwen3-Next: gated DeltaNet and full attention (3:1). Key/value head sizes shrunk from
  128 to 16 for the same reason; the aligned block is 64 tokens (vLLM keeps GDN blocks
  on the prefill kernel's 64-token checkpoint step).
- Jamba: Mamba-1 and attention (4:1). transformers' Mamba-1 scan takes no initial state;
  pagedkv's scan (``pagedkv.hf.mamba1``) starts from the cached one, so Jamba resumes
  from checkpoints and earlier chunks like the others (``mamba_d_state`` 8: 48-token
  aligned blocks).
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.hf.harness import Case, assert_continuous_batching, generator, prompts_for, run, tiny

from pagedkv.hf import PagedGenerator
from pagedkv.specs import MambaSpec

GRANITE = Case("granite-4.0-h-350m", (("mamba_d_state", 8),), prefix_tokens=136, num_blocks=40)
QWEN3_NEXT = Case(
    "Qwen3-Next-80B-A3B-Instruct",
    (("linear_key_head_dim", 16), ("linear_value_head_dim", 16)),
    prefix_tokens=100,
    num_prompts=6,
    max_new_tokens=20,
    num_blocks=16,
)
NEMOTRON_H = Case(
    "Nemotron-H-56B-Base-8K", (("ssm_state_size", 8),), prefix_tokens=136, num_blocks=28
)
JAMBA = Case("Jamba-v0.1", num_blocks=12)
JAMBA_CACHED = Case("Jamba-v0.1", (("mamba_d_state", 8),), prefix_tokens=136, num_blocks=28)


# Chunks longer than a checkpoint block: the runtime may leave the blocks a chunk spans
# null (vLLM's align mode), and passes are cut only where a real block waits.
GRANITE_LONG_CHUNKS = dataclasses.replace(GRANITE, num_blocks=60, max_num_batched_tokens=128)


@pytest.mark.parametrize(
    "case",
    [GRANITE, GRANITE_LONG_CHUNKS, QWEN3_NEXT, NEMOTRON_H, JAMBA_CACHED],
    ids=["granite-4.0-h", "granite-4.0-h-128-token-chunks", "qwen3-next", "nemotron-h", "jamba"],
)
@pytest.mark.slow
def test_token_identical_with_state_checkpoint_hits_and_preemption(case: Case) -> None:
    assert_continuous_batching(case, run(case), min_hit_tokens=48)  # one checkpoint


@pytest.mark.slow
def test_jamba_whole_prefills_without_prefix_caching() -> None:
    gen = PagedGenerator(
        tiny(JAMBA),
        num_blocks=JAMBA.num_blocks,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
    )
    output = gen.generate(prompts_for(JAMBA), JAMBA.max_new_tokens, arrivals_per_step=1)
    assert_continuous_batching(JAMBA, output, min_hit_tokens=0)  # prefix caching off


def test_mamba1_scan_from_a_state_continues_the_whole_scan() -> None:
    import torch

    from pagedkv.hf.mamba1 import selective_scan_from

    gen = torch.Generator().manual_seed(0)
    channels, size, length = 6, 4, 10
    u, dt = (
        torch.randn(1, channels, length, generator=gen),
        torch.randn(1, channels, length, generator=gen),
    )
    a = -torch.rand(channels, size, generator=gen)
    b, c = torch.randn(1, size, length, generator=gen), torch.randn(1, size, length, generator=gen)
    zero = torch.zeros(1, channels, size)
    whole, end = selective_scan_from(zero, u, dt, a, b, c, delta_softplus=True)
    first, middle = selective_scan_from(
        zero, u[..., :4], dt[..., :4], a, b[..., :4], c[..., :4], delta_softplus=True
    )
    rest, end2 = selective_scan_from(
        middle, u[..., 4:], dt[..., 4:], a, b[..., 4:], c[..., 4:], delta_softplus=True
    )
    torch.testing.assert_close(torch.cat([first, rest], -1), whole)
    torch.testing.assert_close(end2, end)


def test_states_live_in_their_blocks() -> None:
    gen = generator(GRANITE)
    state_specs = [v.spec for v in gen.memory.layers.values() if v.layout == "state"]
    assert len(state_specs) == 10
    assert all(isinstance(s, MambaSpec) and s.mamba_cache_mode == "align" for s in state_specs)
    assert {s.block_size for s in state_specs} == {48}


@pytest.mark.slow
def test_a_lost_state_changes_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a zero state instead of the block's (as if the block were not written)
    must change what the model generates."""
    import pagedkv.hf.state as state

    gen = generator(GRANITE)
    load = state.StateIO._load

    def forgetful(self, layer_idx):
        first = layer_idx not in self.loaded
        load(self, layer_idx)
        if first and layer_idx in self.recurrent:
            self.recurrent[layer_idx].zero_()

    monkeypatch.setattr(state.StateIO, "_load", forgetful)
    output = gen.generate(prompts_for(GRANITE), GRANITE.max_new_tokens, arrivals_per_step=1)
    assert output.token_ids != run(GRANITE).token_ids
