"""The planner's exact-partition check on any builder's groups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from pagedkv.errors import PlanningError
from pagedkv.planning.types import KVCacheGroupSpec


def _names(items: Iterable[str], limit: int = 8) -> str:
    ordered = sorted(items)
    shown = ", ".join(repr(n) for n in ordered[:limit])
    return shown + (f" (+{len(ordered) - limit} more)" if len(ordered) > limit else "")


def check_exact_partition(
    groups: Sequence[KVCacheGroupSpec], layer_names: Iterable[str], *, source: str = "builder"
) -> None:
    """Every layer in exactly one group, and no group naming an unknown layer.

    Raises PlanningError naming the duplicated, missing and unknown layers.
    """
    counts = Counter(name for group in groups for name in group.layer_names)
    expected = set(layer_names)
    duplicated = [name for name, n in counts.items() if n > 1]
    missing = expected - counts.keys()
    unknown = counts.keys() - expected
    problems = []
    if duplicated:
        problems.append(f"layers in more than one group: {_names(duplicated)}")
    if missing:
        problems.append(f"layers in no group: {_names(missing)}")
    if unknown:
        problems.append(f"groups name layers that have no KV cache spec: {_names(unknown)}")
    if problems:
        raise PlanningError(
            f"KV cache groups from the {source} are not an exact partition of the layers: "
            + "; ".join(problems)
        )
