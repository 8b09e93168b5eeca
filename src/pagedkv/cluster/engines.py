"""The router's view of each engine: address, health, load (scraped from the engine's
Prometheus ``/metrics`` with vLLM's names, or posted), and requests in flight.

An engine whose ``/metrics`` fails ``unhealthy_after`` scrapes in a row, or refuses a
forwarded request's connection, is down: it leaves the routing and its blocks leave the
index. The first scrape that succeeds again brings it back (its events rebuild its
part of the index).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from pagedkv.cluster.routing import EngineLoad

__all__ = ["EngineState", "ScrapedLoad", "checked_load", "parse_vllm_metrics"]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
_OLD_KV_USAGE = "vllm:gpu_cache_usage_perc"  # vLLM before v1's rename


class ScrapedLoad(NamedTuple):
    load: EngineLoad
    num_engines: int  # label sets found (data-parallel engines behind one server)


def checked_load(running: object, waiting: object, kv_usage: object) -> EngineLoad:
    """An EngineLoad from untrusted numbers; ValueError unless counts are finite and
    >= 0 and the usage a finite number in [0, 1]."""
    values = []
    for name, value in (("running", running), ("waiting", waiting)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number")
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
        values.append(int(value))
    if isinstance(kv_usage, bool) or not isinstance(kv_usage, int | float):
        raise ValueError("kv_usage must be a number")
    if not math.isfinite(kv_usage) or not 0.0 <= kv_usage <= 1.0:
        raise ValueError(f"kv_usage must be in [0, 1], got {kv_usage!r}")
    return EngineLoad(values[0], values[1], float(kv_usage))


def parse_vllm_metrics(text: str) -> ScrapedLoad:
    """Running and waiting requests (summed over label sets) and KV usage (their mean)
    from a vLLM-compatible ``/metrics`` page; ValueError if none is there or one is not
    a finite number >= 0."""
    sums = {RUNNING: 0.0, WAITING: 0.0, KV_USAGE: 0.0}
    counts = dict.fromkeys(sums, 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = KV_USAGE if sample.name == _OLD_KV_USAGE else sample.name
            if name in sums:
                if not math.isfinite(sample.value) or sample.value < 0:
                    raise ValueError(f"{sample.name} = {sample.value!r}")
                sums[name] += sample.value
                counts[name] += 1
    if not counts[RUNNING] and not counts[WAITING]:
        raise ValueError(f"no {RUNNING} or {WAITING} in the metrics")
    usage = sums[KV_USAGE] / counts[KV_USAGE] if counts[KV_USAGE] else 0.0
    load = EngineLoad(int(sums[RUNNING]), int(sums[WAITING]), min(usage, 1.0))
    return ScrapedLoad(load, max(counts.values()))


@dataclass
class EngineState:
    """One engine as the router sees it; the service's event loop owns it."""

    name: str
    url: str | None = None  # HTTP base address (forwarding, scraping)
    healthy: bool = True
    reported: EngineLoad = field(default_factory=EngineLoad)  # scraped or posted
    in_flight: int = 0  # requests this router forwarded and not yet finished
    failures: int = 0  # scrapes failed in a row
    forwarded: int = 0

    def load(self) -> EngineLoad:
        """What routing weighs: the reported load, with at least the requests this
        router has in flight there (a scrape is up to an interval old)."""
        r = self.reported
        if self.in_flight > r.requests:
            return EngineLoad(self.in_flight - r.waiting, r.waiting, r.kv_usage)
        return r


def engine_table(urls: Mapping[str, str | None] | Iterable[str]) -> dict[str, EngineState]:
    if isinstance(urls, Mapping):
        return {name: EngineState(name, url) for name, url in urls.items()}
    return {name: EngineState(name) for name in urls}
