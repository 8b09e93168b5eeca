"""Policies and the host tier in the simulator and in `pagedkv simulate`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from pagedkv.errors import ConfigError
from pagedkv.sim.run import simulate
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import setup_from_model
from pagedkv.sim.tiers import (
    CostModel,
    active_params,
    cost_model_for,
    host_blocks_for,
    tier_plot_lines,
    tier_sweep,
)
from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace

ENV = {**os.environ, "PAGEDKV_TRANSFORMERS": "0"}


@pytest.fixture(scope="module")
def sim_setup():  # type: ignore[no-untyped-def]
    return dataclasses.replace(
        setup_from_model("Llama-3.1-8B", num_blocks=300), hash_algo="builtin"
    )


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return synthetic_trace(SyntheticTraceConfig(num_requests=60, seed=3))


@pytest.mark.slow
def test_host_tier_serves_hits_the_device_lost(sim_setup, trace) -> None:  # type: ignore[no-untyped-def]
    settings = SchedulerSettings(max_num_seqs=8)
    lru = simulate(sim_setup, trace, settings, bound=True)
    tiered = simulate(
        dataclasses.replace(sim_setup, host_num_blocks=2000), trace, settings, bound=True
    )
    assert lru.host_hit_tokens == 0 and lru.tiered_bound_hit_tokens is None
    assert tiered.host_hit_tokens > 0
    assert tiered.hit_tokens > lru.hit_tokens
    assert tiered.hit_tokens <= (tiered.tiered_bound_hit_tokens or 0)
    assert (tiered.tiered_bound_hit_tokens or 0) >= (tiered.bound_hit_tokens or 0)


@pytest.mark.slow
def test_sweep_crosses_policies_and_sizes(sim_setup, trace) -> None:  # type: ignore[no-untyped-def]
    points = tier_sweep(
        sim_setup, trace, SchedulerSettings(max_num_seqs=8), ["lru", "s3fifo"], [150, 300], [0, 500]
    )
    assert [(p.num_blocks, p.host_num_blocks, p.policy) for p in points] == [
        (n, h, pol) for n in (150, 300) for h in (0, 500) for pol in ("lru", "s3fifo")
    ]
    for p in points:
        assert 0 <= p.host_hit_rate <= p.hit_rate <= (p.tiered_bound_hit_rate or p.bound_hit_rate)
        assert p.cache_tokens == (p.num_blocks - 1) * 16 + p.host_num_blocks * 16


def test_cost_model(sim_setup) -> None:  # type: ignore[no-untyped-def]
    cost = CostModel(prefill_tokens_per_s=1000.0, pcie_bytes_per_s=1e6, kv_bytes_per_token=100.0)
    # 2 requests, 3000 prompt tokens, 1000 hits of which 500 from the host:
    # (2000 / 1000 s compute + 500 * 100 / 1e6 s copy) / 2 requests
    assert cost.mean_ttft_s(2, 3000, 1000, 500) == pytest.approx((2.0 + 0.05) / 2)
    h100 = cost_model_for(sim_setup, "H100-80GB", pcie_gbps=25)
    # Llama-3.1-8B: 128 KiB of KV per token (32 layers x 8 heads x 128 x 2 x bf16)
    assert h100.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    assert 20_000 < h100.prefill_tokens_per_s < 40_000  # 0.5 x 989 TFLOP/s / 16 GFLOP
    with pytest.raises(ConfigError, match="TPU-v5e"):
        cost_model_for(sim_setup, "TPU-v5e")
    assert host_blocks_for(sim_setup, 1.0) == 2**30 // (16 * 32 * 8 * 128 * 2 * 2)
    with pytest.raises(ConfigError, match="host-cache-gib"):
        host_blocks_for(sim_setup, -1)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    base = ["simulate", "Llama-3.1-8B", "--num-blocks", "300", "--trace", "synthetic:30:1"]
    return subprocess.run(
        [sys.executable, "-m", "pagedkv.cli", *base, *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


@pytest.mark.heavy
@pytest.mark.slow
def test_cli_reports_tiers_and_sweeps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = _cli("--policy", "lfu", "--host-cache-gib", "0.25", "--bound", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["eviction_policy"] == "lfu" and data["host_num_blocks"] == 128
    assert data["device_hit_tokens"] + data["host_hit_tokens"] == data["hit_tokens"]
    assert data["mean_ttft_s"] <= data["mean_ttft_s_no_cache"]
    assert data["mean_ttft_s_bound"] <= data["mean_ttft_s"] + 1e-9
    png = tmp_path / "tiers.png"
    proc = _cli(
        "--sweep", "--policy", "lru,s3fifo", "--host-cache-gib", "0,0.25", "--plot", str(png)
    )
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 0 and "s3fifo" in proc.stdout
    bad = _cli("--policy", "mru")
    assert bad.returncode != 0 and "unknown eviction policy 'mru'" in bad.stderr
    several = _cli("--policy", "lru,lfu")
    assert several.returncode != 0 and "need --sweep" in several.stderr


def test_cost_model_counts_tensor_parallel_gpus_and_active_params() -> None:
    tp1 = setup_from_model("Llama-3.1-8B", num_blocks=300)
    tp8 = setup_from_model("Llama-3.1-8B", num_blocks=300, tensor_parallel_size=8)
    one, eight = cost_model_for(tp1, "H100-80GB"), cost_model_for(tp8, "H100-80GB")
    # one token's FLOPs are split over 8 GPUs
    assert eight.prefill_tokens_per_s == pytest.approx(8 * one.prefill_tokens_per_s)
    # DeepSeek-V3: 8 of 256 routed experts per token, ~37 of 671 B parameters
    assert 36e9 < active_params("DeepSeek-V3") < 39e9
    assert 12e9 < active_params("Mixtral-8x7B-v0.1") < 14e9  # 2 of 8 experts
    assert active_params("Llama-3.1-8B") == pytest.approx(8.03e9, rel=0.01)


def test_cost_model_takes_gpu_aliases(sim_setup) -> None:  # type: ignore[no-untyped-def]
    assert cost_model_for(sim_setup, "H200") == cost_model_for(sim_setup, "H200-141GB")
    with pytest.raises(ConfigError, match="finite"):
        cost_model_for(sim_setup, "H100-80GB", pcie_gbps=float("nan"))


@pytest.mark.slow
def test_the_bound_is_the_same_whatever_the_policy(sim_setup) -> None:  # type: ignore[no-untyped-def]
    trace = synthetic_trace(SyntheticTraceConfig(num_requests=80, seed=5))
    settings = SchedulerSettings(max_num_seqs=8)
    small = sim_setup.with_num_blocks(120)
    bounds = set()
    for policy in ("lru", "lfu", "s3fifo", "priority"):
        run = dataclasses.replace(small, eviction_policy=policy)
        result = simulate(run, trace, settings, bound=True)
        assert result.hit_tokens <= (result.bound_hit_tokens or 0)
        bounds.add(result.bound_hit_tokens)
    hosted = simulate(dataclasses.replace(small, host_num_blocks=200), trace, settings, bound=True)
    bounds.add(hosted.bound_hit_tokens)
    assert len(bounds) == 1


@pytest.mark.slow
def test_tier_plot_puts_every_host_size_on_the_device_axis(sim_setup, trace) -> None:  # type: ignore[no-untyped-def]
    points = tier_sweep(
        sim_setup, trace, SchedulerSettings(max_num_seqs=8), ["lru"], [75, 150, 300], [0, 20_000]
    )
    lines = tier_plot_lines(points)
    device_only = next(line for line in lines if line.label == "lru")
    hosted = next(line for line in lines if line.label == "lru + host 20,000 blocks")
    # the host tier is 66x the largest device size: plotted against device + host
    # tokens its points would crowd into the last 2% of the axis
    assert hosted.device_tokens == device_only.device_tokens == [74 * 16, 149 * 16, 299 * 16]
    assert any(line.label.startswith("bound, device + host") for line in lines)
