"""vLLM's ``vllm.v1.hisparse.layout``: HiSparse's cache groups and host pool size, laid
out with pagedkv's HiSparse planning (``pagedkv.planning.hisparse``).

The sparse-MLA layers move to a host source group; the indexer stays on the GPU with
resident (write-back cache) and hot (per-request read buffer) groups per packed unit of
source layers. Building the KV cache tensors is vLLM's worker-side layout and stays
outside the KV cache layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv.compat.vllm._outside import outside_function
from pagedkv.compat.vllm.config._engine_config import engine_config
from pagedkv.compat.vllm.v1.core._groups import get_kv_cache_groups
from pagedkv.compat.vllm.v1.hisparse import runtime as _runtime
from pagedkv.compat.vllm.v1.kv_cache_interface import (
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheGroupRole,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)
from pagedkv.planning import hisparse as _plan
from pagedkv.specs.base import cdiv

__all__ = [
    "HISPARSE_HOT_SUFFIX",
    "HISPARSE_RESIDENT_SUFFIX",
    "HiSparseLayout",
    "_build_hisparse_kv_cache_tensors",
    "create_hisparse_layout",
    "get_hisparse_kv_cache_groups",
    "get_hisparse_steady_state_concurrency",
]

HISPARSE_HOT_SUFFIX = ".hisparse_hot"
HISPARSE_RESIDENT_SUFFIX = ".hisparse_resident"


@dataclass
class HiSparseLayout:
    source_group: Any
    device_groups: list[Any]
    host_num_blocks: int
    host_block_stride: int
    shared_host_pool: bool


def get_hisparse_kv_cache_groups(vllm_config: Any, kv_cache_spec: Mapping[str, Any]) -> Any:
    """HiSparse's groups: the host source group, the indexer group, resident and hot
    groups, then the model's other groups; None without HiSparse or MLA layers."""
    attention_config = getattr(vllm_config, "attention_config", None)
    if attention_config is None or getattr(attention_config, "hisparse_config", None) is None:
        return None
    mla = {n: s for n, s in kv_cache_spec.items() if isinstance(s, MLAAttentionSpec)}
    if not mla:
        return None
    derived = (MLAAttentionSpec, HiSparseResidentSpec, HiSparseHotSpec)
    others = {n: s for n, s in kv_cache_spec.items() if not isinstance(s, derived)}
    return _lay_out(vllm_config, mla, get_kv_cache_groups(vllm_config, others))


def _split_roles(specs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    if any(getattr(s, "model_version", None) == "deepseek_v4" for s in specs.values()):
        raise ValueError("HiSparse does not support DeepSeek V4.")
    source = {n: s for n, s in specs.items() if s.cache_role == SparseCacheRole.SPARSE}
    indexer = {n: s for n, s in specs.items() if s.cache_role == SparseCacheRole.INDEXER}
    if not source or not indexer:
        raise ValueError("HiSparse requires sparse-MLA and indexer cache specs.")
    return source, indexer


def _uniform(specs: Mapping[str, Any], what: str) -> Any:
    uniform = UniformTypeKVCacheSpecs.from_specs(dict(specs))
    if uniform is None:
        raise ValueError(f"HiSparse requires uniform {what} cache specs.")
    return uniform


def _hot_rows(vllm_config: Any, source: Mapping[str, Any]) -> int:
    top_k = max(
        s.topk_buffer_width
        if getattr(s, "topk_buffer_width", None) is not None
        else vllm_config.model_config.hf_config.index_topk
        for s in source.values()
    )
    hisparse_config = vllm_config.attention_config.hisparse_config
    return _plan.hot_rows_per_request(
        top_k,
        _max_decode_query_len(vllm_config),
        getattr(hisparse_config, "device_buffer_size", None),
    )


def _max_decode_query_len(vllm_config: Any) -> int:
    """The widest decode query: 1 + the speculative tokens, twice those with model runner
    V1's parallel drafting (its mask slots ride on each verified request)."""
    speculative = getattr(vllm_config, "speculative_config", None)
    num_speculative = getattr(speculative, "num_speculative_tokens", None)
    if num_speculative is None:
        return 1
    width = 1 + int(num_speculative)
    if getattr(speculative, "parallel_drafting", False) is True and not getattr(
        vllm_config, "use_v2_model_runner", False
    ):
        width += int(num_speculative)
    return width


def _lay_out(vllm_config: Any, mla: Mapping[str, Any], regular: Sequence[Any]) -> list[Any]:
    source, indexer = _split_roles(mla)
    block_sizes = {s.block_size for s in (*source.values(), *indexer.values())}
    if len(block_sizes) != 1:
        raise ValueError("HiSparse requires one resolved GPU block size.")
    block_size = block_sizes.pop()
    hot_blocks = cdiv(_hot_rows(vllm_config, source), block_size)
    indexer_group = KVCacheGroupSpec(
        list(indexer),
        _uniform(indexer, "indexer"),
        enable_kv_transfer=True,
        role=KVCacheGroupRole.HISPARSE_INDEXER,
    )
    units: list[list[tuple[str, int]]] = []
    for name, spec in source.items():
        if spec.is_index_group_leader or not units:
            units.append([])
        units[-1].append((name, spec.page_size_bytes))
    indexer_page = sum(s.page_size_bytes for s in indexer.values())
    resident_groups: list[Any] = []
    hot_groups: list[Any] = []
    for packed in _plan.pack_hot_units(units, indexer_page):
        page_sizes = {size for _, size in packed}
        if len(page_sizes) != 1:
            raise ValueError(
                f"HiSparse hot-cache groups require one page size, got {sorted(page_sizes)}."
            )
        page = page_sizes.pop()
        names = [name for name, _ in packed]
        resident_groups.append(
            KVCacheGroupSpec(
                [n + HISPARSE_RESIDENT_SUFFIX for n in names],
                HiSparseResidentSpec(block_size=block_size, page_size=page),
                enable_kv_transfer=False,
            )
        )
        hot_groups.append(
            KVCacheGroupSpec(
                [n + HISPARSE_HOT_SUFFIX for n in names],
                HiSparseHotSpec(
                    block_size=block_size, page_size=page, blocks_per_request=hot_blocks
                ),
                enable_kv_transfer=False,
            )
        )
    source_group = KVCacheGroupSpec(
        list(source),
        _uniform(source, "sparse-MLA"),
        role=KVCacheGroupRole.HISPARSE_SOURCE,
        host_resident=True,
        enable_kv_transfer=True,
    )
    return [source_group, indexer_group, *resident_groups, *hot_groups, *regular]


def create_hisparse_layout(
    vllm_config: Any, groups: Sequence[Any], host_budget: int
) -> HiSparseLayout:
    """Size the host pool for groups from ``get_hisparse_kv_cache_groups``."""
    sources = [g for g in groups if g.host_resident]
    if len(sources) != 1:
        raise ValueError(f"HiSparse needs one host-resident group, got {len(sources)}")
    (source,) = sources
    shared = _runtime.use_shared_hisparse_host_pool(vllm_config)
    plan = _plan.plan_host_pool(
        source.kv_cache_spec.page_size_bytes,
        host_budget,
        max_model_len=vllm_config.model_config.max_model_len,
        block_size=source.kv_cache_spec.block_size,
        alignment_bytes=_runtime.hisparse_host_block_alignment(use_shared_host_pool=shared),
    )
    return HiSparseLayout(
        source_group=source,
        device_groups=[g for g in groups if not g.host_resident],
        host_num_blocks=plan.num_blocks,
        host_block_stride=plan.block_stride_bytes,
        shared_host_pool=shared,
    )


_build_hisparse_kv_cache_tensors = outside_function(
    "_build_hisparse_kv_cache_tensors", "HiSparse host tier", __name__
)


def get_hisparse_steady_state_concurrency(vllm_config: Any, kv_cache_config: Any) -> float:
    """Requests of ``max_model_len`` that run at once once they read from the host."""
    config = engine_config(vllm_config)
    admission = steady = host = 0
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        blocks = spec.max_memory_usage_blocks(config)
        if group.host_resident:
            host += blocks
            continue
        admission += blocks
        if isinstance(spec, HiSparseResidentSpec):
            blocks = min(blocks, _plan.ACTIVE_TAIL_PAGES)
        steady += blocks
    host_num_blocks = kv_cache_config.hisparse_host_num_blocks
    if host_num_blocks is None:
        raise ValueError("HiSparse concurrency needs kv_cache_config.hisparse_host_num_blocks")
    return _plan.steady_state_concurrency(
        kv_cache_config.num_blocks, admission, steady, host_num_blocks, host
    )
