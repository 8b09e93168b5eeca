"""A seeded synthetic trace: shared system prompts, multi-turn conversations, Zipf popularity."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.sim.traces.trace import Segment, Trace, TraceRequest

__all__ = [
    "MAX_MATERIALIZED_REQUESTS",
    "SyntheticTraceConfig",
    "synthetic_trace",
    "iter_synthetic_requests",
]

# Requests one trace may hold in memory (a few hundred bytes each); more is a typo.
MAX_MATERIALIZED_REQUESTS = 10_000_000


@dataclass(frozen=True, kw_only=True)
class SyntheticTraceConfig:
    """Knobs of :func:`synthetic_trace`; token ranges are inclusive."""

    num_requests: int = 1000
    seed: int = 0
    num_system_prompts: int = 20
    system_prompt_tokens: tuple[int, int] = (200, 2000)
    zipf_exponent: float = 1.1
    follow_up_probability: float = 0.5
    max_turns: int = 8
    user_tokens: tuple[int, int] = (20, 800)
    output_tokens: tuple[int, int] = (16, 400)
    max_prompt_tokens: int = 16384
    requests_per_s: float = 2.0
    num_open_conversations: int = 32

    def __post_init__(self) -> None:
        for name in ("num_requests", "num_system_prompts", "max_turns", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"SyntheticTraceConfig.{name} must be >= 1")
        for name in ("system_prompt_tokens", "user_tokens", "output_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ConfigError(f"SyntheticTraceConfig.{name} must be 1 <= low <= high")
        if not 0.0 <= self.follow_up_probability <= 1.0:
            raise ConfigError("SyntheticTraceConfig.follow_up_probability must be in [0, 1]")
        if self.max_prompt_tokens < self.system_prompt_tokens[1] + self.user_tokens[1]:
            raise ConfigError(
                "SyntheticTraceConfig.max_prompt_tokens must hold the longest system prompt "
                "plus the longest user turn"
            )
        if self.requests_per_s <= 0:
            raise ConfigError("SyntheticTraceConfig.requests_per_s must be > 0")


@dataclass
class _Conversation:
    history: list[Segment]
    turns: int


def synthetic_trace(config: SyntheticTraceConfig | None = None, limit: int | None = None) -> Trace:
    """Generate a trace; the same config always gives the same trace. With ``limit`` only
    its first ``limit`` requests are generated (the same ones, lazily)."""
    cfg = config or SyntheticTraceConfig()
    count = cfg.num_requests if limit is None else min(limit, cfg.num_requests)
    if count > MAX_MATERIALIZED_REQUESTS:
        raise ConfigError(
            f"a synthetic trace of {count:,} requests would not fit in memory; generate at "
            f"most {MAX_MATERIALIZED_REQUESTS:,} (a limit takes the first requests only)"
        )
    requests = tuple(itertools.islice(iter_synthetic_requests(cfg), count))
    name = f"synthetic(n={cfg.num_requests}, seed={cfg.seed})"
    return Trace(name, requests)


def iter_synthetic_requests(cfg: SyntheticTraceConfig) -> Iterator[TraceRequest]:
    """The requests of :func:`synthetic_trace`, one at a time."""
    rnd = random.Random(cfg.seed)
    ids = itertools.count()
    systems = [
        Segment(next(ids), rnd.randint(*cfg.system_prompt_tokens))
        for _ in range(cfg.num_system_prompts)
    ]
    weights = [1.0 / (rank + 1) ** cfg.zipf_exponent for rank in range(len(systems))]
    open_convs: list[_Conversation] = []
    now_s = 0.0
    for _ in range(cfg.num_requests):
        now_s += rnd.expovariate(cfg.requests_per_s)
        user = Segment(next(ids), rnd.randint(*cfg.user_tokens))
        if open_convs and rnd.random() < cfg.follow_up_probability:
            conv = rnd.choice(open_convs)
        else:
            conv = _Conversation([rnd.choices(systems, weights)[0]], 0)
            open_convs.append(conv)
            if len(open_convs) > cfg.num_open_conversations:
                open_convs.pop(0)
        prompt = (*conv.history, user)
        num_prompt = sum(seg.num_tokens for seg in prompt)
        if num_prompt > cfg.max_prompt_tokens:
            prompt = (conv.history[0], user)
            conv.history = [conv.history[0]]
            conv.turns = 0
        num_output = rnd.randint(*cfg.output_tokens)
        output_id = next(ids)
        yield TraceRequest(now_s, prompt, num_output, output_id)
        conv.history = [*prompt, Segment(output_id, num_output)]
        conv.turns += 1
        if conv.turns >= cfg.max_turns and conv in open_convs:
            open_convs.remove(conv)
