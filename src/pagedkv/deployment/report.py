"""DeploymentPlan: what ``pagedkv.plan`` returns, and how it shows itself in a notebook
(rounded, labelled figures) or as text."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedkv.capacity.report import KVCachePlan
from pagedkv.config import EngineConfig
from pagedkv.deployment.format import format_bytes, format_int
from pagedkv.models import GPU, MemoryBudget, ModelLayout
from pagedkv.specs import KVCacheSpec

__all__ = ["DeploymentPlan", "SummaryRow"]


class SummaryRow(NamedTuple):
    """One labelled, rounded figure of a plan's summary."""

    label: str
    value: str


@dataclass(frozen=True, kw_only=True)
class DeploymentPlan:
    """One model on one set of workers: the inputs as resolved (layout, EngineConfig,
    GPU, per-worker memory budgets, specs) and the planner's ``kv_cache`` report.

    ``model_limit`` is the longest max_model_len an auto-fit searched;
    ``above_model_limit`` says max_model_len exceeds the model's own limit (allowed by
    ``PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN``).
    """

    layout: ModelLayout
    config: EngineConfig
    gpu: GPU | None
    budgets: tuple[MemoryBudget, ...]
    kv_cache: KVCachePlan
    largest_max_model_len: int
    model_limit: int
    kv_cache_specs: tuple[dict[str, KVCacheSpec], ...]
    above_model_limit: bool = False

    @property
    def num_blocks(self) -> int:
        """KV cache blocks per worker, the null block included (vLLM's num_gpu_blocks)."""
        return self.kv_cache.num_blocks

    @property
    def max_model_len(self) -> int:
        return self.kv_cache.max_model_len

    @property
    def kv_cache_bytes(self) -> int:
        """KV cache budget of worker 0."""
        return self.budgets[0].kv_cache_bytes

    @property
    def max_concurrency(self) -> float | None:
        """vLLM's "Maximum concurrency for max_model_len tokens per request" (null block
        counted, as vLLM prints it)."""
        return self.kv_cache.concurrency_at(self.max_model_len).vllm_max_concurrency

    @property
    def where(self) -> str:
        return self.gpu.name if self.gpu else "given memory"

    def summary(self) -> list[SummaryRow]:
        """The headline figures, rounded and labelled."""
        config, layout, budget, kv = self.config, self.layout, self.budgets[0], self.kv_cache
        parallel = config.parallel
        rows = [
            SummaryRow("model", f"{layout.name} ({layout.num_params / 1e9:.2f}B params)"),
            SummaryRow(
                "workers",
                f"{self.where}, TP {parallel.tensor_parallel_size} x "
                f"PP {parallel.pipeline_parallel_size}",
            ),
            SummaryRow("KV cache dtype", config.kv_cache_dtype),
        ]
        if budget.device_bytes:
            rows += [
                SummaryRow("device memory", format_bytes(budget.device_bytes)),
                SummaryRow("weights per worker", format_bytes(budget.weight_bytes)),
                SummaryRow("activation reserve", format_bytes(budget.activation_bytes)),
            ]
        concurrency = self.max_concurrency
        rows += [
            SummaryRow("KV cache per worker", format_bytes(budget.kv_cache_bytes)),
            SummaryRow(
                "blocks per worker", f"{format_int(kv.num_blocks)} x {kv.block_size} tokens"
            ),
            SummaryRow("max_model_len", format_int(kv.max_model_len)),
            SummaryRow(
                "max concurrency at max_model_len",
                "unbounded" if concurrency is None else f"{concurrency:.2f}x",
            ),
            SummaryRow("padding waste per request", f"{kv.waste_fraction:.2%}"),
        ]
        if layout.filled_fields:
            filled = ", ".join(f"{k} {_short(v)}" for k, v in layout.filled_fields)
            rows.append(SummaryRow("config fields from class defaults", filled))
        return rows

    def __repr__(self) -> str:
        return (
            f"DeploymentPlan(model={self.layout.name!r}, where={self.where!r}, "
            f"num_blocks={self.num_blocks}, max_model_len={self.max_model_len})"
        )

    def __str__(self) -> str:
        rows = self.summary()
        width = max(len(r.label) for r in rows)
        return "\n".join(f"{r.label:<{width}}  {r.value}" for r in rows)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("DeploymentPlan(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr><th style='text-align:left'>{html.escape(r.label)}</th>"
            f"<td style='text-align:right;white-space:nowrap'>{html.escape(r.value)}</td></tr>"
            for r in self.summary()
        )
        caption = html.escape(f"KV cache plan: {self.layout.name} on {self.where}")
        return f"<table><caption>{caption}</caption>{cells}</table>"


def _short(value: Any) -> str:
    return (
        format_int(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)
    )
