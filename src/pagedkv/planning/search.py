"""Searching page sizes and group sizes for the hybrid grouping that wastes least.

Every candidate puts all layers on one page size ``P`` (layer slot ``i`` is shared by
every group; a layer's block size is raised, then its page padded; Mamba states are
padded, after the attention block size is raised until a page holds a state) and
splits each bucket into groups of at most ``g`` layers: a block id costs ``g * P``.
Within the group budget the fewest bytes per max-length request win; within
``TOLERANCE`` of that vLLM's own rule is kept when it qualifies, else the fewest
groups, then the smallest block size. See docs/planning.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.specs.base import AttentionSpec, KVCacheSpec, cdiv
from pagedkv.specs.full import MLAAttentionSpec
from pagedkv.specs.local import SlidingWindowMLASpec
from pagedkv.specs.mamba import MambaSpec

TOLERANCE = 0.01
# Groupings scored (and reported) up to this many groups, or the budget if larger.
MAX_GROUPS = 64
# CacheConfig.max_kv_cache_groups=None: see docs/planning.md for the measurements.
DEFAULT_MAX_KV_CACHE_GROUPS = 16
PAGE_MULTIPLES = (1, 2, 4)
MAMBA_BLOCK_STEPS = 4
MAX_LCM_FACTOR = 16


@dataclass(frozen=True)
class Bucket:
    """Layers whose specs merge into one group spec, in model order, with their specs."""

    layer_names: tuple[str, ...]
    specs: tuple[KVCacheSpec, ...]

    def __len__(self) -> int:
        return len(self.layer_names)

    @property
    def first(self) -> KVCacheSpec:
        return self.specs[0]


def vllm_group_size(bucket_sizes: Sequence[int]) -> int:
    """vLLM's rule: the smallest bucket, unless the largest is under 1.5x of it."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest


def is_state_spec(spec: KVCacheSpec) -> bool:
    """Pages that hold a fixed-size state whatever the block size."""
    return isinstance(spec, MambaSpec)


def can_pad(spec: KVCacheSpec) -> bool:
    """MLA kernels read latents densely, so MLA pages are never padded."""
    if isinstance(spec, MLAAttentionSpec | SlidingWindowMLASpec):
        return False
    return any(f.name == "page_size_padded" for f in dataclasses.fields(spec))


def pad_to(spec: KVCacheSpec, page_bytes: int) -> KVCacheSpec | None:
    """``spec`` with its page padded to ``page_bytes`` (None when it cannot be)."""
    if spec.page_size_bytes == page_bytes:
        return spec
    if spec.real_page_size_bytes > page_bytes or not can_pad(spec):
        return None
    padded = None if spec.real_page_size_bytes == page_bytes else page_bytes
    return dataclasses.replace(spec, page_size_padded=padded)  # type: ignore[call-arg]


def fit_page(
    spec: KVCacheSpec, page_bytes: int, *, state_block_size: int, scale_then_pad: bool = True
) -> KVCacheSpec | None:
    """``spec`` refitted so its page is exactly ``page_bytes``, or None. States take
    ``state_block_size`` and are padded; others get the largest block-size factor whose
    page fits, then padding (vLLM's rule, ``scale_then_pad=False``: scaled only when
    the page divides ``page_bytes``, else padded at the current block size)."""
    if is_state_spec(spec):
        if spec.real_page_size_bytes > page_bytes:
            return None
        return pad_to(dataclasses.replace(spec, block_size=state_block_size), page_bytes)
    page = spec.page_size_bytes
    if page >= page_bytes:
        return spec if page == page_bytes else None
    factor = page_bytes // page
    if factor > 1 and (scale_then_pad or page_bytes % page == 0):
        spec = spec.copy_with_new_block_size(spec.block_size * factor)
        if spec.page_size_bytes > page_bytes:
            return None
    return pad_to(spec, page_bytes)


def mamba_aligned_block_size(
    attention_specs: Sequence[KVCacheSpec],
    state_specs: Sequence[KVCacheSpec],
    block_size: int,
    multiple: int,
) -> int:
    """Smallest attention block size whose page holds the largest state: ``k * cdiv(m,
    k * a)`` rounded up to the platform's ``multiple``, ``k`` the engine block size
    rounded up to it (reference 6.4)."""
    per_token = max(
        s.bytes_per_token
        if isinstance(s, AttentionSpec)
        else cdiv(s.real_page_size_bytes, s.block_size)
        for s in attention_specs
    )
    state_bytes = max(s.real_page_size_bytes for s in state_specs)
    k = multiple * cdiv(block_size, multiple)
    aligned = k * cdiv(state_bytes, k * per_token)
    return max(block_size, multiple * cdiv(aligned, multiple))


@dataclass(frozen=True)
class PageCandidate:
    """Buckets refitted to one page size."""

    name: str
    page_size_bytes: int
    buckets: tuple[Bucket, ...]
    blocks_per_request: tuple[int, ...]
    real_bytes_per_block: tuple[int, ...]


def _refit(
    buckets: Sequence[Bucket], fit: Callable[[KVCacheSpec], KVCacheSpec | None]
) -> tuple[Bucket, ...] | None:
    # Keyed with is_draft too: it does not take part in equality but must survive.
    cache: dict[tuple[KVCacheSpec, bool], KVCacheSpec | None] = {}
    out = []
    for bucket in buckets:
        specs = []
        for spec in bucket.specs:
            key = (spec, spec.is_draft)
            if key not in cache:
                cache[key] = fit(spec)
            fitted = cache[key]
            if fitted is None:
                return None
            specs.append(fitted)
        out.append(Bucket(bucket.layer_names, tuple(specs)))
    return tuple(out)


def _fit_all(
    name: str,
    buckets: Sequence[Bucket],
    page_bytes: int,
    attention_block_size: int | None,
    config: EngineConfig,
    exact: bool = False,
) -> PageCandidate | None:
    """The buckets refitted to ``page_bytes`` (None if one cannot be): attention-like
    layers first; states then take the attention block size."""

    def fit_other(spec: KVCacheSpec) -> KVCacheSpec | None:
        if is_state_spec(spec):
            return spec
        if attention_block_size is not None:
            spec = spec.copy_with_new_block_size(attention_block_size)
        return fit_page(spec, page_bytes, state_block_size=0, scale_then_pad=not exact)

    fitted = _refit(buckets, fit_other)
    if fitted is None:
        return None
    sizes = [b.first.block_size for b in fitted if not is_state_spec(b.first)]
    state_bs = max(sizes) if sizes else max(b.first.block_size for b in buckets)

    def fit_state(spec: KVCacheSpec) -> KVCacheSpec | None:
        if not is_state_spec(spec):
            return spec
        return fit_page(spec, page_bytes, state_block_size=state_bs)

    refitted = _refit(fitted, fit_state)
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
# or None, whether it is vLLM's own choice).
PageOption = tuple[str, int, int | None, bool]


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
    return [(f"page {p} (multiple of the MLA pages)", p, None, False) for p in pages]


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
            options.append((f"attention block {bs}", page, bs, j == 0))
    else:
        pages = sorted({b.first.page_size_bytes for b in buckets})
        largest = max(pages)
        options += [(f"page x{m}", largest * m, None, m == 1) for m in PAGE_MULTIPLES]
        lcm = math.lcm(*pages)
        if lcm not in {largest * m for m in PAGE_MULTIPLES} and lcm <= MAX_LCM_FACTOR * largest:
            options.append(("page lcm", lcm, None, False))
    known = {page for _, page, attn_bs, _ in options if attn_bs is None}
    options += [o for o in _rigid_options(buckets) if o[1] not in known]
    _, vllm_page, vllm_bs, _ = next(o for o in options if o[3])
    vllm = _fit_all("vllm", buckets, vllm_page, vllm_bs, config, exact=True)
    found = [_fit_all(name, buckets, p, bs, config) for name, p, bs, _ in options]
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
    vllm_rule: bool = False,
    max_groups: int | None = None,
) -> SearchResult:
    """vLLM's candidate (or None), the chosen one, every candidate scored, the budget
    (``max_groups``; None: the default). ``vllm_rule`` keeps vLLM's whenever it exists."""
    vllm_page, pages = page_candidates(buckets, config, multiple)
    vllm = None
    if vllm_page is not None:
        vllm = score(vllm_page, vllm_group_size([len(b) for b in buckets]), is_vllm=True)
    limit = max(MAX_GROUPS, group_budget(max_groups), vllm.num_groups if vllm else 0)
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
    budget = max(group_budget(max_groups), vllm.num_groups if vllm and vllm_rule else 0)
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
    if vllm is not None and (vllm_rule or any(s is vllm for s in eligible)):
        chosen = vllm
    else:
        # Fewest groups, then the smallest block size (finer prefix-cache hits), then bytes.
        chosen = min(
            eligible, key=lambda s: (s.num_groups, max(s.block_sizes), s.bytes_per_request)
        )
    return SearchResult(vllm, chosen, scored, budget)
