"""How close `pagedkv plan` comes to what vLLM reported in public start-up logs.

Reads tests/data/vllm_startup_logs.jsonl and, for every row whose model and GPU
pagedkv knows, plans the same command line and compares the KV cache budget with
the log's "Available KV cache memory" line. Each row is planned twice: with the
accounting of the log's own vLLM release (``--vllm-version``; the error this
benchmark's median and worst are taken over) and with vLLM 0.33's. Rows whose log
gives its budget and token count also check the block arithmetic: planning the
log's own budget (to its 0.01 GiB rounding) must give its "GPU KV cache size".

    python benchmarks/plan_vs_vllm_logs.py            # JSON on stdout
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from pagedkv.cli.plan import PlanOptions, make_plan
from pagedkv.cli.plan_render import vllm_kv_cache_tokens

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_startup_logs.jsonl"
GiB = 2**30
# Logs print GiB with two decimals.
ROUNDING_GIB = 0.005


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def request_for(row: dict[str, Any], **extra: Any) -> PlanOptions:
    """The row's command line as a PlanOptions (flags the log names, vLLM defaults else)."""
    engine = row["engine"]
    fields = {
        "tensor_parallel_size": engine.get("tensor_parallel_size", 1),
        "gpu_memory_utilization": engine.get("gpu_memory_utilization", 0.9),
        "max_model_len": engine.get("max_model_len"),
        "block_size": engine.get("block_size", 16),
        "kv_cache_dtype": engine.get("kv_cache_dtype", "auto"),
        "max_num_seqs": engine.get("max_num_seqs"),
        "max_num_batched_tokens": engine.get("max_num_batched_tokens"),
        "enforce_eager": engine.get("enforce_eager", False),
        "flashinfer_sampler": engine.get("flashinfer_sampler", True),
    }
    return PlanOptions(model=row["pagedkv_model"], **{**fields, **extra})


def release(row: dict[str, Any]) -> str:
    return str(row["vllm_version"]).split()[0]


def end_to_end(row: dict[str, Any]) -> dict[str, Any]:
    """Predicted budget (GiB) under the log's release and under 0.33, and their errors."""
    logged = row["available_kv_cache_gib"]
    own = make_plan(request_for(row, gpu=row["pagedkv_gpu"], vllm_version=release(row)))
    now = make_plan(request_for(row, gpu=row["pagedkv_gpu"]))
    own_gib = own.budgets[0].kv_cache_bytes / GiB
    now_gib = now.budgets[0].kv_cache_bytes / GiB
    return {
        "id": row["id"],
        "model": row["pagedkv_model"],
        "gpu": row["pagedkv_gpu"],
        "vllm_version": row["vllm_version"],
        "logged_gib": logged,
        "predicted_gib": round(own_gib, 3),
        "error": round((own_gib - logged) / logged, 4),
        "predicted_gib_0_33": round(now_gib, 3),
        "error_0_33": round((now_gib - logged) / logged, 4),
        "weights_gib": round(own.budgets[0].weight_bytes / GiB, 3),
        "logged_weights_gib": row.get("model_loading_gib"),
    }


def tokens_at(row: dict[str, Any], budget_gib: float) -> int:
    request = request_for(row, kv_cache_memory=f"{budget_gib}GiB")
    return vllm_kv_cache_tokens(make_plan(request))


def given_budget(row: dict[str, Any]) -> dict[str, Any]:
    """The token range the log's rounded budget allows, and whether its figure is in it."""
    logged = row["available_kv_cache_gib"]
    low = tokens_at(row, logged - ROUNDING_GIB)
    high = tokens_at(row, logged + ROUNDING_GIB)
    tokens = row["gpu_kv_cache_tokens"]
    return {"id": row["id"], "logged_tokens": tokens, "tokens_low": low, "tokens_high": high,
            "exact": low <= tokens <= high}  # fmt: skip


def summary(errors: list[float]) -> dict[str, float | None]:
    if not errors:
        return {"median_abs_error": None, "worst_abs_error": None}
    absolute = [abs(e) for e in errors]
    return {
        "median_abs_error": round(statistics.median(absolute), 4),
        "worst_abs_error": round(max(absolute), 4),
        "mean_error": round(statistics.fmean(errors), 4),
    }


def main() -> int:
    rows = load_rows()
    known = [r for r in rows if r["pagedkv_model"]]
    e2e = [end_to_end(r) for r in known if r["pagedkv_gpu"] and r["available_kv_cache_gib"]]
    budget = [
        given_budget(r) for r in known if r["gpu_kv_cache_tokens"] and r["available_kv_cache_gib"]
    ]
    out = {
        "rows": len(rows),
        "rows_planned_end_to_end": len(e2e),
        "end_to_end": e2e,
        "summary": summary([r["error"] for r in e2e]),
        "summary_0_33_accounting": summary([r["error_0_33"] for r in e2e]),
        "given_budget": budget,
        "given_budget_exact": sum(r["exact"] for r in budget),
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
