"""How many Python calls, through how many files, the runtime's request path takes.

The layout is the one vLLM's grouping gives gemma-3-27b-it: six sliding-window groups
(window 1024) and one full-attention group, 16-token blocks. Counted with
``sys.setprofile`` (every Python-level call, the standard library's included):

``admission``: ``get_computed_blocks`` + ``allocate_slots`` of a request whose first
2,032 tokens hit the prefix cache (a 2,048-token prompt cached, three more tokens);
``decode``: ``allocate_slots`` for one decode token inside a block (most steps);
``decode_block_full``: the token that fills a block (caching it, the window sliding);
``decode_new_block``: the token after it, which starts a new block in every group.

Per step the JSON gives the calls, the files they run in (all, and pagedkv's own: the
others are the standard library's or generated, such as a named tuple's ``__new__``) and
any call from a runtime file back to one earlier in the request's order
(``RUNTIME_ORDER``). Counts of calls and files do not depend on the machine's speed; the
counts of calls do on the Python version (3.12 inlines comprehensions).

    python benchmarks/call_path.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple

from pagedkv import (
    EngineConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from pagedkv.runtime import KVCacheManager, Request

__all__ = ["CallTrace", "backward_calls", "gemma3_manager", "measure", "trace_calls"]

BLOCK_SIZE = 16
PROMPT_TOKENS = 2048
# The runtime's files in the order a request goes through them.
RUNTIME_ORDER = (
    "pagedkv/runtime/kv_cache_manager.py",
    "pagedkv/runtime/coordinators.py",
    "pagedkv/runtime/managers/",
    "pagedkv/runtime/block_pool.py",
    "pagedkv/runtime/free_queue.py",
)


def gemma3_manager() -> KVCacheManager:
    """A manager on gemma-3-27b-it's layout: 6 sliding-window groups + 1 full group."""
    window = SlidingWindowSpec(
        block_size=BLOCK_SIZE, num_kv_heads=16, head_size=128, sliding_window=1024
    )
    full = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=16, head_size=128)
    specs: list[KVCacheSpec] = [window] * 6 + [full]
    groups = tuple(
        KVCacheGroupSpec(layer_names=(f"layer{i}",), kv_cache_spec=s) for i, s in enumerate(specs)
    )
    kv = KVCacheConfig(
        num_blocks=20_000, kv_cache_tensors=(), kv_cache_groups=groups, max_model_len=1 << 16
    )
    config = EngineConfig.create(max_model_len=1 << 16, block_size=BLOCK_SIZE)
    return KVCacheManager(kv, config, hash_algo="builtin")


class CallTrace(NamedTuple):
    """What ``trace_calls`` saw: calls per ``(file, function)`` and per caller-callee
    file pair."""

    calls: Counter[tuple[str, str]]
    edges: Counter[tuple[str, str]]


def trace_calls(fn: Callable[[], object]) -> CallTrace:
    """Every Python call made while ``fn`` runs (``fn`` itself not counted)."""
    calls: Counter[tuple[str, str]] = Counter()
    edges: Counter[tuple[str, str]] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            callee = _short(frame.f_code.co_filename)
            calls[(callee, frame.f_code.co_name)] += 1
            if frame.f_back is not None:
                edges[(_short(frame.f_back.f_code.co_filename), callee)] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    here = _short(fn.__code__.co_filename)
    calls[(here, fn.__code__.co_name)] -= 1
    edges[(here, here)] -= 1
    return CallTrace(+calls, +edges)


def backward_calls(edges: Counter[tuple[str, str]]) -> list[str]:
    """Calls from a runtime file to one earlier in ``RUNTIME_ORDER`` (a reader following
    the path would have to turn back)."""
    out = []
    for (caller, callee), count in sorted(edges.items()):
        a, b = _layer(caller), _layer(callee)
        if a is not None and b is not None and b < a:
            out.append(f"{caller} -> {callee} ({count})")
    return out


def _layer(file: str) -> int | None:
    for index, prefix in enumerate(RUNTIME_ORDER):
        if file.startswith(prefix):
            return index
    return None


def _short(filename: str) -> str:
    marker = "/pagedkv/"
    index = filename.rfind(marker)
    return "pagedkv/" + filename[index + len(marker) :] if index >= 0 else filename


def _prompt() -> list[int]:
    return [(i * 104729 + 7919) % 32000 for i in range(PROMPT_TOKENS)]


def measure() -> dict[str, dict[str, Any]]:
    """Calls and files of each step of the request path (see the module docstring)."""
    manager = gemma3_manager()
    warm = Request("warm", _prompt())
    manager.allocate_slots(warm, PROMPT_TOKENS)
    warm.num_computed_tokens = PROMPT_TOKENS
    manager.free(warm)

    req = Request("req", [*_prompt(), 1, 2, 3])
    req.set_hasher(manager.hasher)  # hashing the prompt is the request's, not the path's
    num_new = req.num_tokens - (PROMPT_TOKENS - BLOCK_SIZE)

    def admit() -> None:
        hit, num_hit = manager.get_computed_blocks(req)
        assert num_hit == PROMPT_TOKENS - BLOCK_SIZE, num_hit  # the window before the last
        assert manager.allocate_slots(req, num_new, num_hit, hit) is not None

    steps = {"admission": trace_calls(admit)}
    req.num_computed_tokens = req.num_tokens

    def decode_step(traced: str | None = None) -> None:
        req.append_output_token_ids(7)  # the new token's hash is the request's work
        step = lambda: manager.allocate_slots(req, 1)  # noqa: E731
        if traced is None:
            step()
        else:
            steps[traced] = trace_calls(step)
        req.num_computed_tokens += 1

    def decode_until(position: int) -> None:
        # Decode until the next token is the ``position``-th (mod 16) of its block.
        while (req.num_tokens + 1) % BLOCK_SIZE != position:
            decode_step()

    decode_until(5)
    decode_step("decode")
    decode_until(0)
    decode_step("decode_block_full")
    decode_step("decode_new_block")
    return {name: _summary(trace) for name, trace in steps.items()}


def _summary(trace: CallTrace) -> dict[str, Any]:
    files = sorted({file for file, _ in trace.calls})
    return {
        "calls": sum(trace.calls.values()),
        "num_files": len(files),
        "num_pagedkv_files": sum(file.startswith("pagedkv/") for file in files),
        "backward_calls": backward_calls(trace.edges),
        "files": files,
    }


def main() -> int:
    print(json.dumps(measure(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
