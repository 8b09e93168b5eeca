"""vLLM's packed grouping for block-outermost layouts: groups of different page sizes
share one block stride, so instead of unifying every page the layers are bucketed by
kind and each bucket is split into groups that fill the block the widest needs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pagedkv.errors import PlanningError
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.local import SlidingWindowSpec
from pagedkv.specs.mamba import MambaSpec
from pagedkv.specs.ring import CircularBufferSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "approximate_gcd",
    "packed_kv_cache_groups",
]


def approximate_gcd(values: Sequence[int], lower_bound: int = 1) -> int:
    """The divisor ``d >= lower_bound`` that rounds ``values`` up to multiples of ``d``
    with the least total padding (ties: the larger ``d``); ``lower_bound`` when it
    exceeds every value."""
    if not values or min(values) <= 0:
        raise PlanningError(f"approximate_gcd needs positive values, got {list(values)!r}")
    low = max(1, lower_bound)
    best, best_pad = low, None
    for d in range(low, max(values) + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


@dataclass(frozen=True)
class _Bucket:
    """Layers of one uniform type; ``by_page`` lists them per page size, in model order."""

    spec: UniformTypeKVCacheSpecs
    by_page: dict[int, list[str]]

    @property
    def balanced(self) -> bool:  # one layer of each page size per pattern repeat
        return len({len(names) for names in self.by_page.values()}) == 1

    @property
    def max_layers_per_page(self) -> int:
        return max(len(names) for names in self.by_page.values())

    def widest_group_bytes(self, num_groups: int) -> int:
        return sum(cdiv(len(names), num_groups) * page for page, names in self.by_page.items())


def _buckets(kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[_Bucket]:
    members: list[dict[str, KVCacheSpec]] = []
    for name, spec in kv_cache_spec.items():
        home = next(
            (b for b in members if UniformTypeKVCacheSpecs.is_uniform_type({**b, name: spec})),
            None,
        )
        if home is None:
            members.append({name: spec})
        else:
            home[name] = spec
    buckets = []
    for layers in members:
        uniform = UniformTypeKVCacheSpecs.from_specs(layers)
        if uniform is None:  # a layer alone is always uniform
            raise PlanningError(f"layers {sorted(layers)[:4]} cannot form a KV cache group")
        by_page: dict[int, list[str]] = {}
        for name, layer_spec in layers.items():
            by_page.setdefault(layer_spec.page_size_bytes, []).append(name)
        buckets.append(_Bucket(uniform, by_page))
    return buckets


def packed_kv_cache_groups(kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """vLLM 0.33's packed groups (reference 6.7): balanced buckets (a 1:1 pattern of page
    sizes) split into groups of the same number of pattern repeats; state buckets (Mamba,
    rings, and sliding windows when nothing repeats) split so that no group is wider than
    the block the others need."""
    buckets = _buckets(kv_cache_spec)
    balanced = [b for b in buckets if b.balanced]
    floor = max((b.max_layers_per_page for b in balanced if len(b.by_page) > 1), default=0)
    repeats = approximate_gcd([b.max_layers_per_page for b in balanced], floor) if floor else None

    def num_groups(b: _Bucket) -> int:
        return cdiv(b.max_layers_per_page, repeats) if repeats and b.balanced else 1

    def is_state(b: _Bucket) -> bool:
        first = b.spec.first_spec
        if isinstance(first, MambaSpec | CircularBufferSpec):
            return True
        return repeats is None and isinstance(first, SlidingWindowSpec)

    anchor = max(
        b.widest_group_bytes(len(b.spec.kv_cache_specs) if is_state(b) else num_groups(b))
        for b in buckets
    )
    groups: list[KVCacheGroupSpec] = []
    for b in buckets:
        n = num_groups(b)
        if is_state(b):
            per_block = max(anchor // b.spec.first_spec.page_size_bytes, 1)
            n = max(n, cdiv(len(b.spec.kv_cache_specs), per_block))
        if n == 1:
            names = list(b.spec.kv_cache_specs)
            groups.append(KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=b.spec))
            continue
        pattern = list(zip(*b.by_page.values()))
        for i in range(n):
            names = [name for repeat in pattern[i::n] for name in repeat]
            layers = {nm: b.spec.kv_cache_specs[nm] for nm in names}
            spec = UniformTypeKVCacheSpecs.from_specs(layers)
            if spec is None:
                raise PlanningError(f"layers {names[:4]} cannot form a KV cache group")
            groups.append(KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=spec))
    return groups
