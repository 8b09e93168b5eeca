"""``build_replay``: the setup and the trace of one replay, as ``pagedkv simulate`` makes them."""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv.errors import ConfigError
from pagedkv.sim.replay_inputs import (
    MAX_NUM_BLOCKS,
    CacheOptions,
    TraceOptions,
    build_replay,
    check_fits,
)

MODEL = "Llama-3.1-8B"


def test_blocks_trace_and_cache_options_reach_the_setup() -> None:
    cache = CacheOptions(
        block_size=32, enable_prefix_caching=False, hash_algo="sha256", retention="dense"
    )
    replay = build_replay(MODEL, TraceOptions("synthetic:50:3", limit=20), cache, num_blocks=400)
    assert replay.setup.num_blocks == 400
    assert replay.setup.config.block_size == 32
    assert replay.setup.hash_algo == "sha256"
    assert replay.setup.retention == "dense"
    assert replay.setup.config.cache.enable_prefix_caching is False
    assert len(replay.trace.requests) == 20
    assert replay.model.name == MODEL


def test_the_trace_is_read_inside_the_reading_context(monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedkv.sim.traces.bundled as bundled

    entered: list[str] = []
    real_load_trace = bundled.load_trace

    def load_trace(*args: Any, **kwargs: Any) -> Any:
        entered.append("read")
        return real_load_trace(*args, **kwargs)

    monkeypatch.setattr(bundled, "load_trace", load_trace)

    class Reading:
        def __enter__(self) -> None:
            entered.append("in")

        def __exit__(self, *exc: object) -> None:
            entered.append("out")

    build_replay(
        MODEL, TraceOptions("synthetic:5"), CacheOptions(), num_blocks=200, reading=Reading
    )
    assert entered == ["in", "read", "out"]


def test_gpu_and_blocks_are_alternatives() -> None:
    with pytest.raises(ConfigError, match="--gpu and --num-blocks"):
        build_replay(
            MODEL, TraceOptions("synthetic:5"), CacheOptions(), gpu="H100-80GB", num_blocks=100
        )


def test_too_many_blocks_is_refused() -> None:
    with pytest.raises(ConfigError, match="more than"):
        build_replay(
            MODEL, TraceOptions("synthetic:5"), CacheOptions(), num_blocks=MAX_NUM_BLOCKS + 1
        )


def test_a_trace_longer_than_every_request_fits_is_refused() -> None:
    replay = build_replay(MODEL, TraceOptions("synthetic:5"), CacheOptions(), num_blocks=3)
    with pytest.raises(ConfigError, match="nothing to replay"):
        check_fits(replay, 3)


LONG = 2 * 131_072  # twice Llama-3.1-8B's limit


@pytest.mark.parametrize(
    "where", [{"num_blocks": LONG // 16 + 16}, {"gpu": "H100-80GB"}], ids=["blocks", "gpu"]
)
def test_a_max_model_len_above_the_models_limit_is_warned_once(
    monkeypatch: pytest.MonkeyPatch, where: dict[str, Any]
) -> None:
    monkeypatch.setenv("PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN", "1")
    calls: list[tuple[str, int | None]] = []
    replay = build_replay(
        MODEL,
        TraceOptions("synthetic:5"),
        CacheOptions(max_model_len=LONG),
        warn_long=lambda layout, max_model_len: calls.append((layout.name, max_model_len)),
        **where,
    )
    assert calls == [(MODEL, LONG)]
    assert replay.setup.max_model_len == LONG


def test_a_max_model_len_within_the_models_limit_is_not_warned() -> None:
    calls: list[object] = []
    build_replay(
        MODEL,
        TraceOptions("synthetic:5"),
        CacheOptions(max_model_len=4096),
        num_blocks=400,
        warn_long=lambda *args: calls.append(args),
    )
    assert calls == []
