"""Publisher settings, named and defaulted as vLLM's ``KVEventsConfig``."""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import ConfigError

__all__ = [
    "KVEventsConfig",
    "offset_endpoint_port",
    "binds",
]


@dataclass(frozen=True, kw_only=True)
class KVEventsConfig:
    """Where and how a ``ZmqEventPublisher`` publishes.

    ``endpoint``: the PUB address; bound when it contains ``*`` or ``::`` or is
    ``ipc://``/``inproc://``, connected otherwise (vLLM's rule: a subscriber that
    binds then waits for engines to connect). ``replay_endpoint``: the ROUTER address
    (always bound) that resends buffered batches; None disables replay.
    ``buffer_steps``: batches kept for replay. ``hwm``: the PUB socket's send high-water
    mark (messages queued per subscriber before ZeroMQ drops). ``max_queue_size``:
    batches waiting for the publisher thread; past it ``publish`` drops the batch.
    """

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if not self.endpoint or "://" not in self.endpoint:
            raise ConfigError(f"KVEventsConfig.endpoint: not a ZeroMQ address: {self.endpoint!r}")
        if self.replay_endpoint is not None and "://" not in self.replay_endpoint:
            raise ConfigError(
                f"KVEventsConfig.replay_endpoint: not a ZeroMQ address: {self.replay_endpoint!r}"
            )
        for name in ("buffer_steps", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"KVEventsConfig.{name} must be a positive integer, got {value!r}"
                )
        if not isinstance(self.hwm, int) or isinstance(self.hwm, bool) or self.hwm < 0:
            raise ConfigError(f"KVEventsConfig.hwm must be an integer >= 0, got {self.hwm!r}")


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """The address data-parallel rank ``data_parallel_rank`` uses, as vLLM derives it: a
    TCP port moves up by the rank (port 0, any free port, stays 0), an ``inproc://`` or
    ``ipc://`` name gets ``_dp<rank>``; rank 0 keeps the address as given."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{data_parallel_rank}"
    head, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"KV events endpoint {endpoint!r}: no TCP port to offset by the rank")
    if int(port) == 0:
        return endpoint
    return f"{head}:{int(port) + data_parallel_rank}"


def binds(endpoint: str) -> bool:
    """Whether a PUB socket on ``endpoint`` binds (else it connects), as vLLM decides."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
