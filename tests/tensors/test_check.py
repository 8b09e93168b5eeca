"""The check that matters: the real KVCacheManager + real tensors vs dense attention."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError, NoFreeBlocksError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

torch = pytest.importorskip("torch")

from pagedkv.planning.planner import get_kv_cache_configs  # noqa: E402
from pagedkv.runtime import KVCacheManager  # noqa: E402
from pagedkv.runtime.hashing import BlockHasher  # noqa: E402
from pagedkv.runtime.managers import SlidingWindowManager  # noqa: E402
from pagedkv.tensors import find_unsafe_overlaps, paged_attention  # noqa: E402
from pagedkv.tensors.check import (  # noqa: E402
    CheckReport,
    CheckStalledError,
    PagedAttentionMismatch,
    check_paged_attention,
)
from pagedkv.tensors.workload import WorkloadRequest, random_workload  # noqa: E402

from .configs import DEVICES, layer_outer_config  # noqa: E402

BS = 4


def attn(cls: type = FullAttentionSpec, **kw: object) -> KVCacheSpec:
    base: dict[str, object] = dict(block_size=BS, num_kv_heads=2, head_size=8, dtype="float32")
    if cls in (MLAAttentionSpec, SlidingWindowMLASpec):
        base = dict(block_size=BS, head_size=12, dtype="float32")
    return cls(**{**base, **kw})


WINDOW = attn(SlidingWindowSpec, sliding_window=8)
MODELS: dict[str, dict[str, KVCacheSpec]] = {
    "full": {f"l{i}": attn() for i in range(3)},
    "full+window": {f"l{i}": WINDOW if i % 3 else attn() for i in range(6)},
    "full+chunked": {
        f"l{i}": attn(ChunkedLocalAttentionSpec, attention_chunk_size=8) if i % 2 else attn()
        for i in range(4)
    },
    "mla": {"m0": attn(MLAAttentionSpec), "m1": attn(MLAAttentionSpec)},
    "mla+window": {
        f"m{i}": attn(SlidingWindowMLASpec, sliding_window=6) if i % 2 else attn(MLAAttentionSpec)
        for i in range(4)
    },
    # Unequal pages: the planner gives the smaller-page groups bigger blocks.
    "unequal pages": {
        "f0": attn(),
        "f1": attn(num_kv_heads=1),
        "w0": attn(SlidingWindowSpec, sliding_window=8, num_kv_heads=1),
        "w1": attn(SlidingWindowSpec, sliding_window=8, head_size=4),
    },
}
STATE = MambaSpec(
    block_size=BS, shapes=((4, 6), (2, 8)), dtypes=("float32", "float32"), mamba_cache_mode="align"
)
MODELS["full+mamba"] = {"f0": attn(), "s0": STATE, "s1": STATE, "f1": attn()}
WINDOWED = {"full+window", "full+chunked", "mla+window", "unequal pages"}


def engine(num_blocks: int = 40, **kw: object) -> EngineConfig:
    return EngineConfig.create(
        block_size=BS,
        max_model_len=64,
        max_num_batched_tokens=32,
        num_gpu_blocks_override=num_blocks,
        mamba_cache_mode="align",
        **kw,
    )


def plan(model: str, num_blocks: int = 40, **kw: object) -> tuple[KVCacheConfig, EngineConfig]:
    config = engine(num_blocks, **kw)
    (kv_cache_config,) = get_kv_cache_configs(config, [MODELS[model]], [1 << 30])
    return kv_cache_config, config


def run(planned: tuple[KVCacheConfig, EngineConfig], seed: int = 1, **kw: object) -> CheckReport:
    workload = random_workload(seed, num_requests=16)
    return check_paged_attention(*planned, workload, seed=seed, **kw)


def assert_exercised(report: CheckReport, windowed: bool) -> None:
    assert report.num_preemptions > 0 and report.num_hit_tokens > 0
    assert report.num_attention_checks > report.num_requests
    assert (report.num_null_table_entries > 0) == windowed
    assert report.max_abs_error <= 1e-9


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.slow
def test_paged_attention_agrees_with_dense_every_step(model: str, device: str) -> None:
    planned = plan(model)
    assert find_unsafe_overlaps(planned[0]) == []
    report = run(planned, device=device)
    assert_exercised(report, windowed=model in WINDOWED)
    attention = {n for n, s in MODELS[model].items() if not isinstance(s, MambaSpec)}
    assert set(report.layers_checked) == attention


@pytest.mark.slow
def test_hnd_layout_and_half_precision_storage() -> None:
    specs = {
        name: dataclasses.replace(s, dtype="float16") for name, s in MODELS["full+window"].items()
    }
    config = engine(kv_cache_layout="HND")
    (kv_cache_config,) = get_kv_cache_configs(config, [specs], [1 << 30])
    assert kv_cache_config.kv_cache_layout == "HND"
    assert_exercised(run((kv_cache_config, config)), windowed=True)


@pytest.mark.slow
def test_hand_built_layer_outer_plan() -> None:
    """The same check on a plan built by hand, independent of the planner."""
    groups = [(attn(), ["f0", "f1"]), (WINDOW, ["w0", "w1"]), (WINDOW, ["w2", "w3"])]
    kv_cache_config = layer_outer_config(groups, num_blocks=40)
    assert_exercised(run((kv_cache_config, engine())), windowed=True)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(40, 96),
    model=st.sampled_from(sorted(WINDOWED)),
)
@pytest.mark.slow
def test_random_workloads_and_pool_sizes(seed: int, num_blocks: int, model: str) -> None:
    report = run(plan(model, num_blocks), seed=seed)
    assert report.max_abs_error <= 1e-9


# --- the check must fail when block management is wrong -----------------------


def test_freeing_a_window_block_too_early_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = SlidingWindowManager.get_num_skipped_tokens
    monkeypatch.setattr(
        SlidingWindowManager,
        "get_num_skipped_tokens",
        lambda self, n: original(self, n) + BS if n > 8 else 0,
    )
    with pytest.raises(PagedAttentionMismatch, match=r"layer 'l[1245]' \(group [12]"):
        run(plan("full+window"))


def test_a_cache_hit_on_other_tokens_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block hashes that ignore the tokens make unrelated prompts share blocks."""

    def by_position(self: BlockHasher, request: object) -> list[object]:
        done = len(request.block_hashes)  # type: ignore[attr-defined]
        full = len(request.all_token_ids) // self.block_size  # type: ignore[attr-defined]
        return [self.hash_fn(("block", i)) for i in range(done, full)]

    monkeypatch.setattr(BlockHasher, "__call__", by_position)
    with pytest.raises(PagedAttentionMismatch, match="paged attention differs"):
        run(plan("full"))


def test_two_groups_writing_one_block_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer i of every group shares slot i: if the window group used the full group's
    block ids, its writes would clobber the full layers' keys."""
    original = KVCacheManager.get_block_ids

    def shared(self: KVCacheManager, request_id: str) -> tuple[list[int], ...]:
        ids = original(self, request_id)
        return (ids[0], ids[0], ids[2])

    monkeypatch.setattr(KVCacheManager, "get_block_ids", shared)
    with pytest.raises(PagedAttentionMismatch, match=r"layer 'l\d'"):
        run(plan("full+window"))


@pytest.mark.slow
def test_a_custom_kernel_is_checked_too() -> None:
    """A 'kernel' that ignores the last token of every context fails; the reference
    wrapped as a custom kernel passes."""
    calls = []

    def reference(view, query, metadata, **kw):  # type: ignore[no-untyped-def]
        calls.append(view.layer_name)
        return paged_attention(view, query, metadata, **kw)

    def off_by_one(view, query, metadata, **kw):  # type: ignore[no-untyped-def]
        shorter = metadata._replace(seq_lens=(metadata.seq_lens - 1).clamp(min=1))
        return paged_attention(view, query, shorter, **kw)

    assert run(plan("full"), attention=reference).max_abs_error <= 1e-9 and calls
    with pytest.raises(PagedAttentionMismatch):
        run(plan("full"), attention=off_by_one)


def test_a_state_block_shared_with_attention_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the state group's current block were an attention block, state writes would
    clobber keys: hand the state group the full group's last block."""
    original = KVCacheManager.get_block_ids

    def shared(self: KVCacheManager, request_id: str) -> tuple[list[int], ...]:
        full_ids, state_ids = original(self, request_id)
        return full_ids, [*state_ids[:-1], full_ids[-1]] if state_ids else state_ids

    monkeypatch.setattr(KVCacheManager, "get_block_ids", shared)
    with pytest.raises(PagedAttentionMismatch, match=r"layer 'f\d'"):
        run(plan("full+mamba"))


def test_workloads_that_cannot_run_are_typed_errors() -> None:
    planned = plan("full")
    long = [WorkloadRequest("too-long", tuple(range(60)), tuple(range(10)))]
    with pytest.raises(ConfigError, match="'too-long' has 70 tokens"):
        check_paged_attention(*planned, long)
    with pytest.raises(CheckStalledError, match="3 steps"):
        run(planned, max_steps=3)
    tiny = layer_outer_config([(attn(), ["f0"])], num_blocks=4)  # 3 usable blocks
    wide = [WorkloadRequest("wide", tuple(range(20)), (1,))]
    with pytest.raises(NoFreeBlocksError, match=r"'wide'.*empty KV cache of 4 blocks"):
        check_paged_attention(tiny, engine(), wide)


@pytest.mark.slow
def test_chunk_not_a_multiple_of_the_block_size() -> None:
    spec = ChunkedLocalAttentionSpec(
        block_size=8, num_kv_heads=2, head_size=4, dtype="float32", attention_chunk_size=12
    )
    config = EngineConfig.create(
        block_size=8, max_model_len=64, max_num_batched_tokens=8, num_gpu_blocks_override=86
    )
    (kv_cache_config,) = get_kv_cache_configs(config, [{"l0": spec, "l1": spec}], [1 << 30])
    workload = random_workload(556597, num_requests=12)
    check_paged_attention(kv_cache_config, config, workload, max_num_batched_tokens=8)
