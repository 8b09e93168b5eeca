"""The bundled accelerator table (memory capacity and bandwidth)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from pagedkv.errors import ConfigError


@dataclass(frozen=True)
class GPU:
    """One accelerator. ``memory_bytes`` is the vendor figure read as decimal GB,
    ``memory_bytes_binary`` the same read as GiB; ``usable_memory_bytes`` what a
    process was observed to see, when known."""

    name: str
    vendor: str
    variant: str
    memory_type: str
    memory_bytes: int
    memory_bytes_binary: int
    usable_memory_bytes: int | None
    bandwidth_bytes_per_s: int
    confidence: str

    @property
    def planning_memory_bytes(self) -> int:
        """The figure plans use: observed usable memory if known; else, for HBM parts
        (binary-sized stacks), the vendor GB read as GiB; else the vendor GB as decimal."""
        if self.usable_memory_bytes:
            return self.usable_memory_bytes
        if self.memory_type.upper().startswith("HBM") and self.memory_bytes_binary:
            return self.memory_bytes_binary
        return self.memory_bytes

    @property
    def planning_memory_source(self) -> str:
        """How ``planning_memory_bytes`` was chosen, in words."""
        if self.usable_memory_bytes:
            return "observed usable memory"
        if self.memory_bytes_binary and self.planning_memory_bytes == self.memory_bytes_binary:
            return "vendor GB read as GiB (HBM)"
        return "vendor GB"


def _gpu(name: str, entry: dict[str, Any]) -> GPU:
    usable = entry.get("usable_memory_observed") or {}
    return GPU(
        name=name,
        vendor=entry.get("vendor", ""),
        variant=entry.get("variant", ""),
        memory_type=entry.get("memory_type", ""),
        memory_bytes=int(entry["memory_bytes"]),
        memory_bytes_binary=int(entry.get("memory_bytes_if_vendor_gb_read_as_gib") or 0),
        usable_memory_bytes=int(usable["bytes"]) if usable.get("bytes") else None,
        bandwidth_bytes_per_s=int(entry.get("memory_bandwidth_bytes_per_s") or 0),
        confidence=entry.get("confidence", ""),
    )


@lru_cache(maxsize=1)
def _table() -> dict[str, GPU]:
    text = (resources.files("pagedkv") / "data" / "gpus.json").read_text(encoding="utf-8")
    return {name: _gpu(name, entry) for name, entry in json.loads(text)["gpus"].items()}


def list_gpus() -> list[GPU]:
    """Every bundled GPU, in table order."""
    return list(_table().values())


def get_gpu(name: str) -> GPU:
    """A GPU by name, case-insensitively; a unique prefix works too (``h100``)."""
    table = _table()
    key = name.strip().lower()
    exact = [g for n, g in table.items() if n.lower() == key]
    if exact:
        return exact[0]
    matches = [g for n, g in table.items() if n.lower().startswith(key)]
    if len(matches) == 1 and key:
        return matches[0]
    known = ", ".join(table)
    what = "is ambiguous" if matches else "is not in the GPU table"
    raise ConfigError(f"GPU {name!r} {what}; known: {known}")
