"""The ``least-waste`` grouping rule's search: page sizes and group sizes for the
hybrid grouping that wastes least.

Every candidate puts all layers on one page size ``P`` (layer slot ``i`` is shared by
every group; a layer's block size is raised, then its page padded; Mamba states are
padded, after the attention block size is raised until a page holds a state) and
splits each bucket into groups of at most ``g`` layers: a block id costs ``g * P``.
Within the group budget the fewest bytes per max-length request win; within
``TOLERANCE`` of that vLLM's own rule is kept when it qualifies, else the fewest
groups, then the smallest block size. See docs/planning.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning.grouping import vllm_group_size
from pagedkv.planning.pages import (
    Bucket,
    Fit,
    can_pad,
    fit_page,
    is_state_spec,
    mamba_aligned_block_size,
    unify_pages,
    vllm_page,
)
from pagedkv.specs.base import KVCacheSpec, cdiv

__all__ = [
    "TOLERANCE",
    "MAX_GROUPS",
    "DEFAULT_MAX_KV_CACHE_GROUPS",
    "PAGE_MULTIPLES",
    "MAMBA_BLOCK_STEPS",
    "MAX_LCM_FACTOR",
    "fit_scaled",
    "PageCandidate",
    "fit_candidate",
    "PageOption",
    "page_candidates",
    "Scored",
    "score",
    "group_budget",
    "SearchResult",
    "search",
]

TOLERANCE = 0.01
# Groupings scored (and reported) up to this many groups, or the budget if larger.
MAX_GROUPS = 64
# CacheConfig.max_kv_cache_groups=None: see docs/planning.md for the measurements.
DEFAULT_MAX_KV_CACHE_GROUPS = 16
PAGE_MULTIPLES = (1, 2, 4)
MAMBA_BLOCK_STEPS = 4
MAX_LCM_FACTOR = 16


def fit_scaled(spec: KVCacheSpec, page_bytes: int, state_block_size: int) -> KVCacheSpec | None:
    """Like vLLM's ``fit_page``, but a page that does not divide ``page_bytes`` first gets
    the largest block-size factor that fits, and only the rest is padded."""
    page = spec.page_size_bytes
    if not is_state_spec(spec) and page_bytes // page > 1 and page_bytes % page:
        spec = spec.copy_with_new_block_size(spec.block_size * (page_bytes // page))
        if spec.page_size_bytes > page_bytes:
            return None
    return fit_page(spec, page_bytes, state_block_size)


@dataclass(frozen=True)
class PageCandidate:
    """Buckets refitted to one page size."""

    name: str
    page_size_bytes: int
    buckets: tuple[Bucket, ...]
    blocks_per_request: tuple[int, ...]
    real_bytes_per_block: tuple[int, ...]


def fit_candidate(
    name: str,
    buckets: Sequence[Bucket],
    page_bytes: int,
    attention_block_size: int | None,
    config: EngineConfig,
    fit: Fit = fit_scaled,
) -> PageCandidate | None:
    """The buckets refitted to ``page_bytes`` with what scoring needs (None if one
    layer cannot be).

    Args:
        name: the candidate's label in the scored list.
        buckets: the layers to place, one bucket per mergeable kind of spec.
        page_bytes: the common page size to refit every layer to, in bytes.
        attention_block_size: block size in tokens for attention-like layers (None: each keeps its
            own, scaled by ``fit``).
        config: the engine config each group's per-request block count is taken from.
        fit: the rule refitting one spec to a page (``fit_scaled`` by default).
    """
    refitted = unify_pages(buckets, page_bytes, attention_block_size, fit)
    if refitted is None:
        return None
    blocks = tuple(b.first.max_memory_usage_blocks(config) for b in refitted)
    real_pages: dict[int, int] = {}  # by id: refitted specs repeat the same objects
    for spec in (s for b in refitted for s in b.specs):
        if id(spec) not in real_pages:
            real_pages[id(spec)] = spec.real_page_size_bytes
    real = tuple(sum(real_pages[id(s)] for s in b.specs) for b in refitted)
    return PageCandidate(name, page_bytes, refitted, blocks, real)


# A target page: (name, page bytes, attention block size fixed first (attention + Mamba)
# or None).
PageOption = tuple[str, int, int | None]


def _rigid_options(buckets: Sequence[Bucket]) -> list[PageOption]:
    """Pages that are multiples of every unpaddable (MLA) page and hold every other page."""
    rigid = [b.first for b in buckets if not is_state_spec(b.first) and not can_pad(b.first)]
    if not rigid:
        return []
    unit = math.lcm(*(s.page_size_bytes for s in rigid))
    floor = max(
        s.real_page_size_bytes if is_state_spec(s) else s.page_size_bytes
        for s in (b.first for b in buckets)
    )
    first = cdiv(floor, unit)
    pages = [unit * j for j in range(first, first + 3) if unit * j <= MAX_LCM_FACTOR * floor]
    return [(f"page {p} (multiple of the MLA pages)", p, None) for p in pages]


def page_candidates(
    buckets: Sequence[Bucket], config: EngineConfig, multiple: int
) -> tuple[PageCandidate | None, list[PageCandidate]]:
    """vLLM's page choice (None when its rule cannot unify) and the searched ones."""
    attention = [b.first for b in buckets if not is_state_spec(b.first)]
    states = [b.first for b in buckets if is_state_spec(b.first)]
    options: list[PageOption] = []
    if states and attention:
        aligned = mamba_aligned_block_size(attention, states, config.block_size, multiple)
        step = multiple * cdiv(config.block_size, multiple)
        for j in range(MAMBA_BLOCK_STEPS):
            bs = aligned + j * step
            page = max(s.copy_with_new_block_size(bs).page_size_bytes for s in attention)
            options.append((f"attention block {bs}", page, bs))
    else:
        pages = sorted({b.first.page_size_bytes for b in buckets})
        largest = max(pages)
        options += [(f"page x{m}", largest * m, None) for m in PAGE_MULTIPLES]
        lcm = math.lcm(*pages)
        if lcm not in {largest * m for m in PAGE_MULTIPLES} and lcm <= MAX_LCM_FACTOR * largest:
            options.append(("page lcm", lcm, None))
    known = {page for _, page, attn_bs in options if attn_bs is None}
    options += [o for o in _rigid_options(buckets) if o[1] not in known]
    page, attn_bs = vllm_page(buckets, config.block_size, multiple)
    vllm = fit_candidate("vllm", buckets, page, attn_bs, config, fit=fit_page)
    found = [fit_candidate(name, buckets, p, bs, config) for name, p, bs in options]
    return vllm, [c for c in found if c is not None]


@dataclass(frozen=True)
class Scored:
    page: PageCandidate
    group_size: int
    num_groups: int
    bytes_per_block: int
    bytes_per_request: int
    waste_fraction: float
    is_vllm: bool = False

    @property
    def block_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({b.first.block_size for b in self.page.buckets}))


def score(page: PageCandidate, group_size: int, is_vllm: bool = False) -> Scored:
    counts = [cdiv(len(b), group_size) for b in page.buckets]
    bytes_per_block = group_size * page.page_size_bytes
    need = bytes_per_block * sum(c * n for c, n in zip(counts, page.blocks_per_request))
    real = sum(r * n for r, n in zip(page.real_bytes_per_block, page.blocks_per_request))
    waste = (need - real) / need if need else 0.0
    return Scored(page, group_size, sum(counts), bytes_per_block, need, waste, is_vllm)


def group_budget(max_groups: int | None) -> int:
    """The group budget in force: ``CacheConfig.max_kv_cache_groups`` or the default."""
    return DEFAULT_MAX_KV_CACHE_GROUPS if max_groups is None else max_groups


class SearchResult(NamedTuple):
    vllm: Scored | None
    chosen: Scored
    scored: list[Scored]
    max_groups: int

    def within_budget(self, s: Scored) -> bool:
        return s.num_groups <= self.max_groups


def search(
    buckets: Sequence[Bucket],
    config: EngineConfig,
    multiple: int,
    *,
    max_groups: int | None = None,
) -> SearchResult:
    """vLLM's candidate (or None), the chosen one, every candidate scored, the budget
    (``max_groups``; None: the default).

    Args:
        buckets: the layers to place, one bucket per mergeable kind of spec.
        config: the engine config candidates are scored against.
        multiple: the platform's block-size multiple, in tokens.
        max_groups: most KV cache groups a candidate may use (None: the default budget, which gives
            way when nothing meets it).
    """
    vllm_page, pages = page_candidates(buckets, config, multiple)
    vllm = None
    if vllm_page is not None:
        vllm = score(vllm_page, vllm_group_size([len(b) for b in buckets]), is_vllm=True)
    budget = group_budget(max_groups)
    limit = max(MAX_GROUPS, budget, vllm.num_groups if vllm else 0)
    largest = max(len(b) for b in buckets)
    scored = [score(p, g) for p in pages for g in range(1, largest + 1)]
    scored = [s for s in scored if s.num_groups <= limit]
    if vllm is not None:
        scored.append(vllm)
    if not scored:
        raise PlanningError(
            "cannot unify the page sizes of these layers: "
            + "; ".join(f"{b.first.kind} ({b.layer_names[0]}...)" for b in buckets)
        )
    # The budget in force; an explicit one that no candidate meets is an error, the
    # default one gives way to the fewest groups.
    within = [s for s in scored if s.num_groups <= budget]
    if not within:
        budget = min(s.num_groups for s in scored)
        if max_groups is not None:
            raise PlanningError(
                f"CacheConfig.max_kv_cache_groups={max_groups} cannot be met: these layers "
                f"need at least {budget} KV cache groups (one per kind of layer spec)"
            )
        within = [s for s in scored if s.num_groups == budget]
    best = min(s.bytes_per_request for s in within)
    eligible = [s for s in within if s.bytes_per_request <= best * (1 + TOLERANCE)]
    if vllm is not None and any(s is vllm for s in eligible):
        chosen = vllm
    else:
        # Fewest groups, then the smallest block size (finer prefix-cache hits), then bytes.
        chosen = min(
            eligible, key=lambda s: (s.num_groups, max(s.block_sizes), s.bytes_per_request)
        )
    return SearchResult(vllm, chosen, scored, budget)
