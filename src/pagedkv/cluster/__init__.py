"""Fleet-level KV awareness: an index of which engine holds which block (fed by KV events),
routing policies over it, and (``pagedkv.cluster.service``, ``route`` extra) the route
service. The core never imports this package."""

from pagedkv.cluster.hashing import PromptHasher
from pagedkv.cluster.index import KVIndex
from pagedkv.cluster.routing import (
    ROUTERS,
    BalancedRouter,
    CostRouter,
    EngineLoad,
    LeastLoadedRouter,
    PrefixRouter,
    RoundRobinRouter,
    Router,
    make_router,
)

__all__ = [
    "ROUTERS",
    "BalancedRouter",
    "CostRouter",
    "EngineLoad",
    "KVIndex",
    "LeastLoadedRouter",
    "PrefixRouter",
    "PromptHasher",
    "RoundRobinRouter",
    "Router",
    "make_router",
]
