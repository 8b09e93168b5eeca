"""Hypothesis: random spec mixes, memory sizes and worker counts keep the planner's invariants."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pagedkv import (
    ChunkedLocalAttentionSpec,
    EngineConfig,
    InsufficientMemoryError,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    plan_kv_cache,
)
from pagedkv.errors import PlanningError
from pagedkv.planning import check_aliasing
from pagedkv.planning.placement import PlacedRegion

from .models import GiB, full, sliding

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def layer_spec(draw: st.DrawFn) -> KVCacheSpec:
    kind = draw(st.sampled_from(["full", "full", "sliding", "chunked", "mamba", "mla"]))
    bs = draw(st.sampled_from([16, 16, 32]))
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    head = draw(st.sampled_from([64, 128]))
    dtype = draw(st.sampled_from(["bfloat16", "bfloat16", "fp8"]))
    if kind == "full":
        return full(heads=heads, head=head, bs=bs, dtype=dtype)
    if kind == "sliding":
        return sliding(draw(st.sampled_from([64, 1024])), heads=heads, head=head, bs=bs)
    if kind == "chunked":
        return ChunkedLocalAttentionSpec(
            block_size=bs, num_kv_heads=heads, head_size=head, attention_chunk_size=256
        )
    if kind == "mla":
        return MLAAttentionSpec(block_size=64, head_size=576)
    inner = draw(st.sampled_from([256, 1024, 4096]))
    return MambaSpec(
        block_size=bs,
        shapes=((inner, 3), (inner, 16)),
        dtypes=("bfloat16", "bfloat16"),
        mamba_cache_mode=draw(st.sampled_from(["none", "align"])),
    )


@st.composite
def cluster(draw: st.DrawFn) -> tuple[EngineConfig, list[dict[str, KVCacheSpec]], list[int]]:
    specs = draw(st.lists(layer_spec(), min_size=1, max_size=16))
    layers = {f"layers.{i}": s for i, s in enumerate(specs)}
    pp = draw(st.integers(1, min(3, len(layers))))
    tp = draw(st.sampled_from([1, 2]))
    names = list(layers)
    cuts = (
        sorted(
            draw(
                st.lists(
                    st.integers(1, len(names) - 1), min_size=pp - 1, max_size=pp - 1, unique=True
                )
            )
        )
        if pp > 1
        else []
    )
    bounds = [0, *cuts, len(names)]
    stages = [{n: layers[n] for n in names[a:b]} for a, b in pairwise(bounds)]
    workers = [stage for stage in stages for _ in range(tp)]
    memory = draw(
        st.lists(st.integers(16 << 20, 4 * GiB), min_size=len(workers), max_size=len(workers))
    )
    length = draw(st.sampled_from([-1, 512, 4096]))
    override = draw(st.sampled_from([None, None, 4]))
    config = EngineConfig.create(
        max_model_len=length,
        tensor_parallel_size=tp,
        pipeline_parallel_size=len(stages),
        num_gpu_blocks_override=override,
        kv_cache_grouping_rule=draw(st.sampled_from(["vllm", "least-waste"])),
    )
    return config, workers, memory


def plan_or_skip(config, workers, memory):  # type: ignore[no-untyped-def]
    try:
        return plan_kv_cache(config, workers, memory, max_model_len_limit=1 << 16)
    except InsufficientMemoryError:
        assume(False)
        raise
    except PlanningError as exc:  # as vLLM: an MLA page it can neither scale nor pad
        assume("vLLM's grouping cannot unify" not in str(exc))
        raise


def brute_force_violations(kv: KVCacheConfig) -> list[tuple[str, str]]:
    """Pairs of layers sharing a byte in one allocation at different block ids or in one group."""
    group_of = {n: gid for gid, g in enumerate(kv.kv_cache_groups) for n in g.layer_names}
    spans = []
    for tensor in kv.kv_cache_tensors:
        for r in tensor.regions():
            for b in range(kv.num_blocks):
                lo, hi = r.block_range(b)
                spans.append(
                    (tensor.host_resident, lo, hi, b, group_of[r.layer_name], r.layer_name)
                )
    spans.sort()
    bad = []
    active: list[tuple[bool, int, int, int, int, str]] = []
    for span in spans:
        active = [a for a in active if a[0] == span[0] and a[2] > span[1]]
        for a in active:
            if a[3] != span[3] or a[4] == span[4]:
                bad.append((a[5], span[5]))
        active.append(span)
    return bad


@SETTINGS
@given(cluster())
@pytest.mark.slow
def test_planner_invariants(
    case: tuple[EngineConfig, list[dict[str, KVCacheSpec]], list[int]],
) -> None:
    config, workers, memory = case
    plan = plan_or_skip(config, workers, memory)
    every_layer = {n for w in workers for n in w}
    global_names = [n for g in plan.groups for n in g.layer_names]
    assert sorted(global_names) == sorted(every_layer)  # each layer in exactly one group
    assert len({c.num_blocks for c in plan.configs}) == 1
    for kv, specs, available in zip(plan.configs, workers, memory):
        names = [n for g in kv.kv_cache_groups for n in g.layer_names]
        assert sorted(names) == sorted(specs)
        assert len(kv.kv_cache_groups) == len(plan.groups)
        assert all(t.size <= available for t in kv.kv_cache_tensors)
        assert kv.device_bytes <= available
        assert set(kv.layer_regions()) == set(specs)
        assert kv.max_model_len == plan.max_model_len > 0
    if config.cache.num_gpu_blocks_override:
        assert plan.num_blocks == config.cache.num_gpu_blocks_override
    point = plan.max_concurrency[0]
    assert point.blocks_per_request <= plan.usable_blocks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster())
def test_regions_never_overlap_unsafely(
    case: tuple[EngineConfig, list[dict[str, KVCacheSpec]], list[int]],
) -> None:
    config, workers, memory = case
    config = config.replace(num_gpu_blocks_override=24, max_model_len=16)
    plan = plan_or_skip(config, workers, memory)
    for kv in plan.configs:
        assert brute_force_violations(kv) == []


@SETTINGS
@given(cluster())
@pytest.mark.slow
def test_search_never_worse_than_vllm(
    case: tuple[EngineConfig, list[dict[str, KVCacheSpec]], list[int]],
) -> None:
    config, workers, memory = case
    plan = plan_or_skip(config.replace(kv_cache_grouping_rule="least-waste"), workers, memory)
    chosen = [a for a in plan.alternatives if a.chosen]
    vllm = [a for a in plan.alternatives if a.name == "vllm"]
    if plan.alternatives:
        assert len(chosen) == 1
    if chosen:
        assert chosen[0].within_budget
    if vllm and chosen and vllm[0].within_budget:
        assert chosen[0].bytes_per_request <= vllm[0].bytes_per_request * 1.01
        best = min(a.bytes_per_request for a in plan.alternatives if a.within_budget)
        if vllm[0].bytes_per_request <= best * 1.01:
            assert chosen[0].name == "vllm"


@st.composite
def regions(draw: st.DrawFn) -> tuple[list[PlacedRegion], int]:
    num_blocks = draw(st.integers(1, 4))
    count = draw(st.integers(1, 6))
    out = []
    for i in range(count):
        stride = draw(st.sampled_from([4, 8]))
        page = draw(st.integers(1, stride))
        offset = draw(st.integers(0, 24))
        out.append(PlacedRegion(offset, stride, page, draw(st.integers(0, 2)), f"l{i}"))
    return out, num_blocks


@settings(max_examples=300, deadline=None)
@given(regions())
@pytest.mark.slow
def test_aliasing_check_matches_brute_force(case: tuple[list[PlacedRegion], int]) -> None:
    placed, num_blocks = case
    owners: dict[int, list[tuple[int, int]]] = {}
    expected_ok = True
    for r in placed:
        for b in range(num_blocks):
            for x in range(
                r.offset + b * r.block_stride, r.offset + b * r.block_stride + r.page_size_bytes
            ):
                for block, group in owners.get(x, []):
                    if block != b or group == r.group_id:
                        expected_ok = False
                owners.setdefault(x, []).append((b, r.group_id))
    try:
        check_aliasing(placed, num_blocks)
        ok = True
    except PlanningError:
        ok = False
    if ok:
        assert expected_ok  # never accepts an unsafe placement
    exact = num_blocks == 1 or len({r.block_stride for r in placed}) == 1
    if exact:
        assert ok == expected_ok  # and rejects only unsafe ones when strides agree


def test_brute_force_oracle_sees_a_bad_placement() -> None:
    from pagedkv import KVCacheGroupSpec, KVCacheTensor

    groups = (
        KVCacheGroupSpec(layer_names=("a",), kv_cache_spec=full()),
        KVCacheGroupSpec(layer_names=("b",), kv_cache_spec=full()),
    )

    def tensor(layer: str, offset: int) -> KVCacheTensor:
        return KVCacheTensor(
            size=4 * 65536,
            layers=(layer,),
            layer_stride=0,
            block_stride=65536,
            page_size_bytes=65536,
            offset=offset,
        )

    good = KVCacheConfig(
        num_blocks=3, kv_cache_tensors=(tensor("a", 0), tensor("b", 0)), kv_cache_groups=groups
    )
    shifted = KVCacheConfig(
        num_blocks=3, kv_cache_tensors=(tensor("a", 0), tensor("b", 65536)), kv_cache_groups=groups
    )
    assert brute_force_violations(good) == []
    assert {frozenset(p) for p in brute_force_violations(shifted)} == {frozenset("ab")}
