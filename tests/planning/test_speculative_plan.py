"""Speculative decoding in the planner, as vLLM 0.33 derives it from a speculative
config: sliding-window layers keep ``num_prefill_lookahead_tokens - 1`` extra tokens
(the prompt tokens a drafter reads past a chunk: 1 for EAGLE-family drafters, the
speculative tokens for a chain of MTP modules, none otherwise), and the groups holding
draft layers are EAGLE groups when vLLM drops their trailing block.

``VLLM_ROWS`` was recorded by evaluating vLLM 0.33.0's own ``VllmConfig.num_prefill_
lookahead_tokens`` and ``SpeculativeConfig.use_eagle_block_drop`` on speculative configs
of each method (``/tmp/vllm-peer-venv/bin/python`` on stand-in configs carrying method,
num_speculative_tokens, the draft's num_nextn_predict_layers and disable_eagle_block_drop).
"""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv import EngineConfig
from pagedkv.errors import ConfigError
from pagedkv.planning import plan_kv_cache_configs
from pagedkv.specs import FullAttentionSpec, SlidingWindowSpec

# (method, num_speculative_tokens, draft modules, disable_eagle_block_drop) ->
# (vLLM's num_prefill_lookahead_tokens, use_eagle_block_drop)
VLLM_ROWS = [
    (None, 1, 1, False, 0, False),
    (None, 1, 1, True, 0, False),
    (None, 3, 1, False, 0, False),
    (None, 3, 1, True, 0, False),
    (None, 3, 3, False, 0, False),
    (None, 3, 3, True, 0, False),
    (None, 4, 2, False, 0, False),
    (None, 4, 2, True, 0, False),
    ("eagle", 1, 1, False, 1, True),
    ("eagle", 1, 1, True, 1, False),
    ("eagle", 3, 1, False, 1, True),
    ("eagle", 3, 1, True, 1, False),
    ("eagle", 3, 3, False, 1, True),
    ("eagle", 3, 3, True, 1, False),
    ("eagle", 4, 2, False, 1, True),
    ("eagle", 4, 2, True, 1, False),
    ("eagle3", 1, 1, False, 1, True),
    ("eagle3", 1, 1, True, 1, False),
    ("eagle3", 3, 1, False, 1, True),
    ("eagle3", 3, 1, True, 1, False),
    ("eagle3", 3, 3, False, 1, True),
    ("eagle3", 3, 3, True, 1, False),
    ("eagle3", 4, 2, False, 1, True),
    ("eagle3", 4, 2, True, 1, False),
    ("mtp", 1, 1, False, 1, True),
    ("mtp", 1, 1, True, 1, False),
    ("mtp", 3, 1, False, 1, True),
    ("mtp", 3, 1, True, 1, False),
    ("mtp", 3, 3, False, 3, True),
    ("mtp", 3, 3, True, 3, False),
    ("mtp", 4, 2, False, 4, True),
    ("mtp", 4, 2, True, 4, False),
    ("dflash", 1, 1, False, 1, False),
    ("dflash", 1, 1, True, 1, False),
    ("dflash", 3, 1, False, 1, False),
    ("dflash", 3, 1, True, 1, False),
    ("dflash", 3, 3, False, 1, False),
    ("dflash", 3, 3, True, 1, False),
    ("dflash", 4, 2, False, 1, False),
    ("dflash", 4, 2, True, 1, False),
    ("dspark", 1, 1, False, 1, False),
    ("dspark", 1, 1, True, 1, False),
    ("dspark", 3, 1, False, 1, False),
    ("dspark", 3, 1, True, 1, False),
    ("dspark", 3, 3, False, 1, False),
    ("dspark", 3, 3, True, 1, False),
    ("dspark", 4, 2, False, 1, False),
    ("dspark", 4, 2, True, 1, False),
    ("ngram", 1, 1, False, 0, False),
    ("ngram", 1, 1, True, 0, False),
    ("ngram", 3, 1, False, 0, False),
    ("ngram", 3, 1, True, 0, False),
    ("ngram", 3, 3, False, 0, False),
    ("ngram", 3, 3, True, 0, False),
    ("ngram", 4, 2, False, 0, False),
    ("ngram", 4, 2, True, 0, False),
    ("draft_model", 1, 1, False, 0, False),
    ("draft_model", 1, 1, True, 0, False),
    ("draft_model", 3, 1, False, 0, False),
    ("draft_model", 3, 1, True, 0, False),
    ("draft_model", 3, 3, False, 0, False),
    ("draft_model", 3, 3, True, 0, False),
    ("draft_model", 4, 2, False, 0, False),
    ("draft_model", 4, 2, True, 0, False),
]
GiB = 1 << 30


def _config(method: str | None, k: int, modules: int, disable: bool) -> EngineConfig:
    return EngineConfig.create(
        max_model_len=4096,
        speculative_method=method,
        num_speculative_tokens=k if method else 0,
        num_draft_modules=modules,
        disable_eagle_block_drop=disable,
        num_lookahead_tokens=k if method else 0,
    )


def _full(**kw: object) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", **kw)


def _sliding(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=window
    )


@pytest.mark.parametrize("row", VLLM_ROWS, ids=lambda r: "-".join(map(str, r[:4])))
def test_prefill_lookahead_and_block_drop_equal_vllms(row: tuple) -> None:
    method, k, modules, disable, prefill, drop = row
    scheduler = _config(method, k, modules, disable).scheduler
    assert (scheduler.num_prefill_lookahead_tokens, scheduler.use_eagle_block_drop) == (
        prefill,
        drop,
    )


@pytest.mark.parametrize(
    ("method", "k", "modules", "retained"),
    [("eagle", 3, 1, 0), ("mtp", 3, 3, 2), ("mtp", 3, 1, 0), (None, 0, 1, 0)],
)
def test_sliding_windows_keep_the_prefill_lookahead(
    method: str | None, k: int, modules: int, retained: int
) -> None:
    """EAGLE reads one token ahead, so a 3-token EAGLE keeps no extra token (the
    scheduler's num_lookahead_tokens, 3, is not the prefill lookahead)."""
    config = _config(method, k, modules, False)
    specs = {"s": _sliding(128), "f": _full()}
    (kv,) = plan_kv_cache_configs(config, [specs], [GiB]).configs
    (spec,) = [s for g in kv.kv_cache_groups for n, s in g.layer_specs().items() if n == "s"]
    assert isinstance(spec, SlidingWindowSpec) and spec.extra_retained_tokens == retained


def test_lookahead_slots_without_a_drafter_keep_no_extra_tokens() -> None:
    config = EngineConfig.create(max_model_len=4096, num_lookahead_tokens=4)
    (kv,) = plan_kv_cache_configs(config, [{"s": _sliding(128)}], [GiB]).configs
    (group,) = kv.kv_cache_groups
    assert group.kv_cache_spec.extra_retained_tokens == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "disable", "marked"),
    [
        ("eagle", False, True),
        ("mtp", False, True),
        ("eagle", True, False),
        ("dflash", False, False),
        (None, False, False),
    ],
)
def test_groups_holding_draft_layers_are_eagle_groups(
    method: str | None, disable: bool, marked: bool
) -> None:
    """The draft's sliding-window layer gets a group of its own; it is the EAGLE group
    exactly when vLLM drops the trailing block for the method."""
    config = _config(method, 2, 1, disable)
    draft = dataclasses.replace(_sliding(256), is_draft=True)
    specs = {"t0": _full(), "t1": _full(), "draft": draft}
    (kv,) = plan_kv_cache_configs(config, [specs], [GiB]).configs
    flags = {n: g.is_eagle_group for g in kv.kv_cache_groups for n in g.layer_names}
    assert flags == {"t0": False, "t1": False, "draft": marked}


def test_a_speculative_method_must_be_named() -> None:
    with pytest.raises(ConfigError, match="speculative_method"):
        EngineConfig.create(speculative_method="")


def test_vllm_serves_speculative_config_reaches_the_planner() -> None:
    import pagedkv

    flags = '{"method": "mtp", "num_speculative_tokens": 3}'
    plan = pagedkv.plan("DeepSeek-V3", gpu="H200", tensor_parallel_size=8, speculative_config=flags)
    scheduler = plan.config.scheduler
    assert (scheduler.speculative_method, scheduler.num_speculative_tokens) == ("mtp", 3)
    assert scheduler.num_draft_modules == 1  # DeepSeek-V3 has one MTP module
    assert (scheduler.num_prefill_lookahead_tokens, scheduler.use_eagle_block_drop) == (1, True)
