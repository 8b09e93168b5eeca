"""vLLM's page unification: every layer of a hybrid fitted to one page size (a page
that divides it scaled, others padded, states padded; MLA never padded), the attention
block size first raised to hold a Mamba state. The least-waste search reuses it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedkv.specs.base import AttentionSpec, KVCacheSpec, cdiv
from pagedkv.specs.full import MLAAttentionSpec
from pagedkv.specs.local import SlidingWindowMLASpec
from pagedkv.specs.mamba import MambaSpec

__all__ = [
    "Bucket",
    "is_state_spec",
    "can_pad",
    "pad_to",
    "fit_page",
    "checkpoint_step",
    "mamba_aligned_block_size",
    "Fit",
    "unify_pages",
    "vllm_page",
]


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


def fit_page(spec: KVCacheSpec, page_bytes: int, state_block_size: int) -> KVCacheSpec | None:
    """``spec`` refitted to a page of exactly ``page_bytes``, or None (vLLM's rule): a
    state takes ``state_block_size`` and is padded; a page dividing ``page_bytes`` has
    its block size scaled; any other page is padded."""
    if is_state_spec(spec):
        if spec.real_page_size_bytes > page_bytes:
            return None
        resized = dataclasses.replace(spec, block_size=state_block_size)
        grid = getattr(spec, "prefill_checkpoint_alignment", None)
        if grid and grid % spec.block_size == 0 and state_block_size != spec.block_size:
            # A checkpoint grid on block boundaries (vLLM's gated DeltaNet: the block
            # and the kernel's step) stays on them: lcm of the new block and the grid.
            grid = math.lcm(state_block_size, grid)
            resized = dataclasses.replace(resized, prefill_checkpoint_alignment=grid)  # type: ignore[call-arg]
        return pad_to(resized, page_bytes)
    page = spec.page_size_bytes
    if page >= page_bytes:
        return spec if page == page_bytes else None
    if page_bytes % page == 0:
        spec = spec.copy_with_new_block_size(spec.block_size * (page_bytes // page))
        if spec.page_size_bytes > page_bytes:
            return None
    return pad_to(spec, page_bytes)


def checkpoint_step(state_specs: Sequence[KVCacheSpec]) -> int:
    """The token step every align-mode state can export a prefill checkpoint at (the
    lcm of their steps), 1 unless each of them declares one, as vLLM requires."""
    steps = [
        s.prefill_checkpoint_alignment
        for s in state_specs
        if isinstance(s, MambaSpec)
        and s.mamba_cache_mode == "align"
        and s.num_prefill_checkpoint_blocks > 0
    ]
    if not steps or len(steps) < len(state_specs) or None in steps:
        return 1
    return math.lcm(*(s for s in steps if s is not None))


def mamba_aligned_block_size(
    attention_specs: Sequence[KVCacheSpec],
    state_specs: Sequence[KVCacheSpec],
    block_size: int,
    multiple: int,
) -> int:
    """Smallest attention block size whose page holds the largest state: ``k * cdiv(m,
    k * a)`` rounded up to the platform's ``multiple``, ``k`` the engine block size
    rounded up to it and, in align mode, to the states' prefill checkpoint step (vLLM
    0.33 puts internal checkpoints on block boundaries; reference 6.4).

    Args:
        attention_specs: the attention-like specs; the largest bytes per token among them sets the
            page growth per token.
        state_specs: the Mamba-like state specs; the largest state page must fit.
        block_size: the engine block size, in tokens.
        multiple: the platform's block-size multiple, in tokens.
    """
    per_token = max(
        s.bytes_per_token
        if isinstance(s, AttentionSpec)
        else cdiv(s.real_page_size_bytes, s.block_size)
        for s in attention_specs
    )
    state_bytes = max(s.real_page_size_bytes for s in state_specs)
    k = math.lcm(multiple * cdiv(block_size, multiple), checkpoint_step(state_specs))
    aligned = k * cdiv(state_bytes, k * per_token)
    return max(block_size, multiple * cdiv(aligned, multiple))


Fit = Callable[[KVCacheSpec, int, int], "KVCacheSpec | None"]


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


def unify_pages(
    buckets: Sequence[Bucket],
    page_bytes: int,
    attention_block_size: int | None,
    fit: Fit = fit_page,
) -> tuple[Bucket, ...] | None:
    """The buckets refitted to ``page_bytes`` (None if one cannot be): attention-like
    layers first (at ``attention_block_size`` when given); states then take the
    attention block size.

    Args:
        buckets: the layers to place, one bucket per mergeable kind of spec.
        page_bytes: the common page size to refit every layer to, in bytes.
        attention_block_size: block size in tokens for attention-like layers (None: each keeps its
            own, scaled by ``fit``).
        fit: the rule refitting one spec to a page (vLLM's ``fit_page`` by default).
    """

    def fit_other(spec: KVCacheSpec) -> KVCacheSpec | None:
        if is_state_spec(spec):
            return spec
        if attention_block_size is not None:
            spec = spec.copy_with_new_block_size(attention_block_size)
        return fit(spec, page_bytes, 0)

    fitted = _refit(buckets, fit_other)
    if fitted is None:
        return None
    sizes = [b.first.block_size for b in fitted if not is_state_spec(b.first)]
    state_bs = max(sizes) if sizes else max(b.first.block_size for b in buckets)
    return _refit(fitted, lambda s: fit(s, page_bytes, state_bs) if is_state_spec(s) else s)


def vllm_page(buckets: Sequence[Bucket], block_size: int, multiple: int) -> tuple[int, int | None]:
    """vLLM's page size and attention block size (None: unchanged): for attention +
    Mamba the attention page at the aligned block size, else the largest page."""
    attention = [b.first for b in buckets if not is_state_spec(b.first)]
    states = [b.first for b in buckets if is_state_spec(b.first)]
    if states and attention:
        bs = mamba_aligned_block_size(attention, states, block_size, multiple)
        return max(s.copy_with_new_block_size(bs).page_size_bytes for s in attention), bs
    return max(b.first.page_size_bytes for b in buckets), None
