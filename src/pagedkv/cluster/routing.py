"""Routing policies: pick the engine for a request from cached blocks and load.

Every policy sees, per engine (same order everywhere): the leading prompt blocks it
holds (``cached_blocks``, from ``KVIndex.prefix_blocks``) and its ``EngineLoad``. Ties
go to the engine with the fewest requests (running + waiting), then rotate, so equal
engines share the work instead of the first one taking it all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pagedkv.errors import ConfigError

__all__ = [
    "EngineLoad",
    "Router",
    "RoundRobinRouter",
    "LeastLoadedRouter",
    "PrefixRouter",
    "CostRouter",
    "BalancedRouter",
    "ROUTERS",
    "make_router",
]


class EngineLoad(NamedTuple):
    """What an engine reports (or the simulator knows) about its load."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # used / usable blocks, 0..1

    @property
    def requests(self) -> int:
        return self.running + self.waiting


class Router(ABC):
    """Chooses an engine index for one request."""

    name = "router"
    uses_cache = False  # whether choose() reads cached_blocks (callers may skip the lookup)

    def __init__(self) -> None:
        self._turn = 0

    @abstractmethod
    def choose(
        self, cached_blocks: Sequence[int], loads: Sequence[EngineLoad], num_prompt_blocks: int
    ) -> int:
        """The index of the engine that gets the request."""

    def _spread(self, candidates: list[int], loads: Sequence[EngineLoad]) -> int:
        """Among equally scored ``candidates``: fewest requests, then the next in turn."""
        if len(candidates) > 1:
            least = min(loads[i].requests for i in candidates)
            candidates = [i for i in candidates if loads[i].requests == least]
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def _best(self, scores: Sequence[float], loads: Sequence[EngineLoad]) -> int:
        top = max(scores)
        return self._spread([i for i, s in enumerate(scores) if s >= top - 1e-12], loads)


class RoundRobinRouter(Router):
    """Engines in turn, blind to caches and load."""

    name = "round-robin"

    def choose(
        self, cached_blocks: Sequence[int], loads: Sequence[EngineLoad], num_prompt_blocks: int
    ) -> int:
        self._turn += 1
        return (self._turn - 1) % len(loads)


class LeastLoadedRouter(Router):
    """Lowest load by ``metric``: ``requests`` (running + waiting), ``running`` or
    ``kv_usage``."""

    name = "least-loaded"
    METRICS = ("requests", "running", "kv_usage")

    def __init__(self, metric: str = "requests") -> None:
        super().__init__()
        if metric not in self.METRICS:
            raise ConfigError(
                f"least-loaded metric must be one of {', '.join(self.METRICS)}, got {metric!r}"
            )
        self.metric = metric

    def choose(
        self, cached_blocks: Sequence[int], loads: Sequence[EngineLoad], num_prompt_blocks: int
    ) -> int:
        if self.metric == "kv_usage":
            return self._best([-load.kv_usage for load in loads], loads)
        if self.metric == "running":
            return self._best([-float(load.running) for load in loads], loads)
        return self._best([-float(load.requests) for load in loads], loads)


class PrefixRouter(Router):
    """Most cached leading blocks; load only breaks ties."""

    name = "prefix"
    uses_cache = True

    def choose(
        self, cached_blocks: Sequence[int], loads: Sequence[EngineLoad], num_prompt_blocks: int
    ) -> int:
        return self._best([float(c) for c in cached_blocks], loads)


class CostRouter(Router):
    """A weighted sum of scorers in [0, 1], as llm-d's scheduler and Dynamo's KV router
    combine them: ``prefix_weight * cached/prompt blocks - load_weight * requests /
    max requests - kv_weight * KV usage``; the highest score wins."""

    name = "cost"
    uses_cache = True

    def __init__(
        self, prefix_weight: float = 2.0, load_weight: float = 1.0, kv_weight: float = 0.0
    ) -> None:
        super().__init__()
        for label, w in (("prefix", prefix_weight), ("load", load_weight), ("kv", kv_weight)):
            if not w >= 0:
                raise ConfigError(f"cost router: {label}_weight must be >= 0, got {w!r}")
        self.prefix_weight = prefix_weight
        self.load_weight = load_weight
        self.kv_weight = kv_weight

    def choose(
        self, cached_blocks: Sequence[int], loads: Sequence[EngineLoad], num_prompt_blocks: int
    ) -> int:
        most = max(max(load.requests for load in loads), 1)
        prompt = max(num_prompt_blocks, 1)
        scores = [
            self.prefix_weight * cached / prompt
            - self.load_weight * load.requests / most
            - self.kv_weight * load.kv_usage
            for cached, load in zip(cached_blocks, loads)
        ]
        return self._best(scores, loads)


class BalancedRouter(Router):
    """Prefix affinity while the load is balanced, load first when it is not: SGLang's
    cache-aware policy, with Dynamo's cost to choose among engines that hold the prefix.

    1. The load (running + waiting requests) is out of balance when the busiest engine
       has more than ``balance_abs_threshold`` requests over the idlest *and* more than
       ``balance_rel_threshold`` times as many: the least loaded engine gets the request.
    2. Otherwise, when some engine holds more than ``cache_threshold`` of the prompt's
       blocks, the request goes to the engine of lowest cost among those: blocks left to
       prefill plus ``decode_weight`` blocks per request it already serves (Dynamo's
       prefill + decode load, with load counted in requests).
    3. Otherwise no engine's cache matters much (a shared system prompt alone is a small
       fraction of a long prompt): the least loaded engine gets it, so prompts that share
       only a short prefix spread over the fleet instead of piling onto its first holder.

    Args:
        cache_threshold: fraction of the prompt's blocks, in [0, 1], an engine must hold for prefix
            affinity.
        balance_abs_threshold: requests the busiest engine must have over the idlest for the load to
            be out of balance.
        balance_rel_threshold: times the idlest engine's load the busiest must exceed as well
            (at least 1).
        decode_weight: blocks of cost charged per request an engine already serves (>= 0).
    """

    name = "balanced"
    uses_cache = True

    def __init__(
        self,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 8,
        balance_rel_threshold: float = 1.5,
        decode_weight: float = 4.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= cache_threshold <= 1.0:
            raise ConfigError(
                f"balanced router: cache_threshold must be in [0, 1], got {cache_threshold!r}"
            )
        if not (balance_abs_threshold >= 0 and balance_rel_threshold >= 1.0):
            raise ConfigError(
                "balanced router: balance_abs_threshold must be >= 0 and "
                f"balance_rel_threshold >= 1, got {balance_abs_threshold!r}, "
                f"{balance_rel_threshold!r}"
            )
        if not decode_weight >= 0:
            raise ConfigError(f"balanced router: decode_weight must be >= 0, got {decode_weight!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.decode_weight = decode_weight

    def _least_loaded(self, loads: Sequence[EngineLoad]) -> int:
        return self._best([-float(load.requests) for load in loads], loads)

    def choose(
        self, cached_blocks: Sequence[int], loads: Sequence[EngineLoad], num_prompt_blocks: int
    ) -> int:
        requests = [load.requests for load in loads]
        busiest, idlest = max(requests), min(requests)
        if (
            busiest - idlest > self.balance_abs_threshold
            and busiest > self.balance_rel_threshold * idlest
        ):
            return self._least_loaded(loads)
        prompt = max(num_prompt_blocks, 1)
        holders = [i for i, c in enumerate(cached_blocks) if c / prompt > self.cache_threshold]
        if not holders:
            return self._least_loaded(loads)
        costs = [-(prompt - cached_blocks[i] + self.decode_weight * requests[i]) for i in holders]
        top = max(costs)
        return self._spread([i for i, c in zip(holders, costs) if c >= top - 1e-12], loads)


ROUTERS: dict[str, Callable[[], Router]] = {
    "balanced": BalancedRouter,
    "round-robin": RoundRobinRouter,
    "least-loaded": LeastLoadedRouter,
    "prefix": PrefixRouter,
    "cost": CostRouter,
}


def make_router(name: str, **options: object) -> Router:
    """The router called ``name`` (see ``ROUTERS``), built with ``options``."""
    try:
        factory = ROUTERS[name]
    except KeyError:
        raise ConfigError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"router {name!r}: {exc}") from None
