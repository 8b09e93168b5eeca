"""KV cache events over ZeroMQ in vLLM 0.33's wire format (needs the ``events`` extra: pyzmq).

``ZmqEventPublisher`` publishes a KVCacheManager's events; ``EventSubscriber`` reads a
stream from pagedkv or vLLM, filling sequence gaps through replay. ``pagedkv.events.wire``
(the encoding) and ``pagedkv.events.config`` need no pyzmq: the ZeroMQ classes are
imported on first access, so importing this package alone does not need it either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedkv.events.config import KVEventsConfig

if TYPE_CHECKING:
    from pagedkv.events.publisher import ZmqEventPublisher
    from pagedkv.events.subscriber import Delivery, EventSubscriber

__all__ = ["Delivery", "EventSubscriber", "KVEventsConfig", "ZmqEventPublisher"]

_ZMQ_EXPORTS = {
    "ZmqEventPublisher": "pagedkv.events.publisher",
    "Delivery": "pagedkv.events.subscriber",
    "EventSubscriber": "pagedkv.events.subscriber",
}


def __getattr__(name: str) -> object:
    if name in _ZMQ_EXPORTS:
        import importlib

        return getattr(importlib.import_module(_ZMQ_EXPORTS[name]), name)
    raise AttributeError(f"module 'pagedkv.events' has no attribute {name!r}")
