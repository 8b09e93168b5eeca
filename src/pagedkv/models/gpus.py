"""The bundled accelerator table (memory capacity and bandwidth)."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from pagedkv.errors import ConfigError

__all__ = [
    "GPU",
    "list_gpus",
    "LOCAL",
    "get_gpu",
    "local_gpu",
]


@dataclass(frozen=True)
class GPU:
    """One accelerator. ``memory_bytes`` is the vendor figure read as decimal GB,
    ``memory_bytes_binary`` the same read as GiB; ``usable_memory_bytes`` the total
    CUDA reports (what vLLM multiplies by gpu_memory_utilization), when a public
    log shows it, and ``usable_memory_source`` where. ``compute_capability`` is the
    CUDA (major, minor) of an NVIDIA part, None for other vendors."""

    name: str
    vendor: str
    variant: str
    memory_type: str
    memory_bytes: int
    memory_bytes_binary: int
    usable_memory_bytes: int | None
    bandwidth_bytes_per_s: int
    confidence: str
    aliases: tuple[str, ...] = field(default=(), compare=False)
    usable_memory_source: str = field(default="", compare=False)
    compute_capability: tuple[int, int] | None = field(default=None, compare=False)

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
            return "free memory now (torch)" if self.vendor == LOCAL else "as CUDA reports it"
        if self.memory_bytes_binary and self.planning_memory_bytes == self.memory_bytes_binary:
            return "vendor GB read as GiB (HBM)"
        return "vendor GB"


def _capability(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, minor = str(text).split(".")
    return int(major), int(minor)


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
        aliases=tuple(entry.get("aliases") or ()),
        usable_memory_source=str((usable.get("source") or {}).get("url", "")),
        compute_capability=_capability(entry.get("compute_capability")),
    )


@lru_cache(maxsize=1)
def _table() -> dict[str, GPU]:
    text = (resources.files("pagedkv") / "data" / "gpus.json").read_text(encoding="utf-8")
    return {name: _gpu(name, entry) for name, entry in json.loads(text)["gpus"].items()}


def list_gpus() -> list[GPU]:
    """Every bundled GPU, in table order."""
    return list(_table().values())


LOCAL = "local"


def _key(name: str) -> str:
    """Spelling-insensitive form: case, spaces, dashes and underscores do not matter."""
    return re.sub(r"[\s_-]+", "", name.strip().lower())


@lru_cache(maxsize=1)
def _names() -> dict[str, tuple[str, ...]]:
    """Each spelling (name or alias) to the table entries it names."""
    found: dict[str, list[str]] = {}
    for name, gpu in _table().items():
        for spelling in (name, *gpu.aliases):
            entries = found.setdefault(_key(spelling), [])
            if name not in entries:
                entries.append(name)
    return {key: tuple(entries) for key, entries in found.items()}


def get_gpu(name: str) -> GPU:
    """A GPU by its name or an unambiguous alias (``H200``, ``h100 nvl``), or ``local``
    (``local:N`` for device N).

    Spelling is loose (case, spaces, dashes), matching is not: an alias several entries
    share (``H100``) or an unknown name is an error listing the candidates; nothing is
    guessed from a prefix.
    """
    local = re.fullmatch(rf"{LOCAL}(?::(\d+))?", _key(name))
    if local:
        return local_gpu(int(local.group(1) or 0))
    table = _table()
    entries = _names().get(_key(name), ())
    if len(entries) == 1:
        return table[entries[0]]
    if entries:
        raise ConfigError(f"GPU {name!r} is ambiguous: it could be {', '.join(entries)}; pick one")
    close = difflib.get_close_matches(_key(name), list(_names()), n=6, cutoff=0.6)
    suggestions = list(dict.fromkeys(e for key in close for e in _names()[key]))
    hint = (
        f"did you mean {', '.join(suggestions)}?" if suggestions else f"known: {', '.join(table)}"
    )
    raise ConfigError(
        f"GPU {name!r} is not in the GPU table; {hint} (`pagedkv gpus` lists them all; "
        "--memory gives any size)"
    )


def local_gpu(device: int = 0) -> GPU:
    """The local accelerator as torch sees it; plans use its free memory now."""
    try:
        import torch
    except ImportError:
        raise ConfigError("--gpu local needs torch (pip install 'pagedkv[torch]')") from None
    if not torch.cuda.is_available():
        raise ConfigError(
            "--gpu local: torch sees no CUDA/ROCm device here; name a GPU or give --memory"
        )
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    major, minor = torch.cuda.get_device_capability(device)
    capability = None if torch.version.hip else (int(major), int(minor))
    return GPU(
        name=str(torch.cuda.get_device_name(device)),
        vendor=LOCAL,
        variant=f"cuda:{device}",
        memory_type="",
        memory_bytes=int(total_bytes),
        memory_bytes_binary=0,
        usable_memory_bytes=int(free_bytes),
        bandwidth_bytes_per_s=0,
        confidence="measured",
        compute_capability=capability,
    )
