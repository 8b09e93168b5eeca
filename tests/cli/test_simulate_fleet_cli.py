"""`pagedkv simulate --replicas N --router R` end to end, in process, parsing --json."""

from __future__ import annotations

import json

import pytest

from pagedkv.cli.app import main
from pagedkv.cli.simulate_fleet import replica_counts

BASE = ["simulate", "Llama-3.1-8B", "--num-blocks", "600", "--trace", "synthetic:60:2", "--json"]


@pytest.mark.slow
def test_fleet_json_per_replica_and_overall(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--replicas", "3", "--router", "cost", "--bound"]) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert data["router"] == "cost" and data["num_replicas"] == 3 and len(data["replicas"]) == 3
    assert sum(r["requests"] for r in data["replicas"]) == 60
    assert data["hit_rate"] > 0 and data["imbalance"] >= 1.0
    assert data["bound_hit_rate"] >= data["single_cache_hit_rate"]


@pytest.mark.slow
def test_fleet_sweep_writes_a_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    png = tmp_path / "fleet.png"
    args = [*BASE, "--replicas", "2", "--sweep", "--plot", str(png), "--workers", "1"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["num_replicas"], r["router"]) for r in rows} == {
        (n, r) for n in (1, 2) for r in ("round-robin", "least-loaded", "prefix", "cost", "oracle")
    }
    assert png.stat().st_size > 1000


def test_fleet_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--replicas", "2", "--router", "random"]) == 1
    assert "unknown router 'random'" in capsys.readouterr().err
    assert main([*BASE, "--replicas", "2", "--workers", "2"]) == 1
    assert "add --sweep" in capsys.readouterr().err
    assert main([*BASE, "--replicas", "2", "--steps-csv", "x.csv"]) == 1
    assert "--steps-csv" in capsys.readouterr().err


def test_replica_counts_double_up_to_the_maximum() -> None:
    assert replica_counts(1) == [1] and replica_counts(8) == [1, 2, 4, 8]
    assert replica_counts(6) == [1, 2, 4, 6]


@pytest.mark.slow
def test_every_replica_gets_the_eviction_policy_and_host_tier(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*BASE, "--replicas", "2", "--router", "prefix"]) == 0
    (plain,) = json.loads(capsys.readouterr().out)
    tiered = [*BASE, "--replicas", "2", "--router", "prefix", "--host-cache-gib", "1"]
    assert main(tiered) == 0
    (host,) = json.loads(capsys.readouterr().out)
    assert host["hit_rate"] > plain["hit_rate"]  # 58 % against 48 %: evicted blocks come back
    assert main([*BASE, "--replicas", "2", "--policy", "lfu,lru"]) == 1
    assert "need --sweep" in capsys.readouterr().err


def test_a_policy_sweep_without_a_full_attention_group_has_no_bound(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pagedkv.sim import jobs

    seen = []
    real = jobs.run_jobs

    def recording(job_list, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["workers"])
        return real(job_list, **kwargs)

    monkeypatch.setattr(jobs, "run_jobs", recording)
    # Mistral-7B-v0.1 is all sliding window: as the plain --sweep, no bound column
    args = ["simulate", "Mistral-7B-v0.1", "--num-blocks", "200", "--trace", "synthetic:8:1"]
    assert main([*args, "--sweep", "--policy", "lfu", "--workers", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sweep"]
    assert rows and all(r["policy"] == "lfu" and r["bound_hit_rate"] is None for r in rows)
    assert seen == [1]  # --workers reaches the policy sweep
