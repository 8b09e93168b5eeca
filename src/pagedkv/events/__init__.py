"""KV cache events over ZeroMQ in vLLM 0.33's wire format (needs the ``events`` extra: pyzmq).

``ZmqEventPublisher`` publishes a KVCacheManager's events; ``EventSubscriber`` reads a
stream from pagedkv or vLLM, filling sequence gaps through replay.
"""

from pagedkv.events.config import KVEventsConfig
from pagedkv.events.publisher import ZmqEventPublisher
from pagedkv.events.subscriber import Delivery, EventSubscriber

__all__ = ["Delivery", "EventSubscriber", "KVEventsConfig", "ZmqEventPublisher"]
