"""`--gpu` matching: names and unambiguous aliases only, close matches on a miss, local."""

from __future__ import annotations

import json
import sys
import types
from importlib import resources

import pytest

from pagedkv.errors import ConfigError
from pagedkv.models import get_gpu, list_gpus
from pagedkv.models.gpus import LOCAL

REQUIRED = [
    *["H20", "H100-80GB", "H100-PCIe", "H100-NVL", "H200-141GB", "GH200-96GB", "B200"],
    *["B300", "GB200", "A100-40GB", "A100-80GB", "A10", "L4", "L40S", "RTX-4090"],
    *["RTX-5090", "RTX-6000-Ada", "MI250X", "MI300X", "MI325X", "MI355X", "Gaudi-3"],
    *["TPU-v5e", "TPU-v6e"],
]


def _entries() -> dict[str, dict[str, object]]:
    text = (resources.files("pagedkv") / "data" / "gpus.json").read_text(encoding="utf-8")
    return json.loads(text)["gpus"]


def test_the_table_covers_what_people_deploy() -> None:
    names = {g.name for g in list_gpus()}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize("name", sorted(_entries()))
def test_every_figure_has_a_source(name: str) -> None:
    entry = _entries()[name]
    sources = entry["sources"]
    assert isinstance(sources, list) and sources
    assert all(s["url"].startswith("http") and s["quote"] for s in sources)
    # Memory in bytes as the vendor states it: the vendor's GB figure, decimal.
    stated = str(entry["memory_capacity_vendor"])
    assert f"{int(entry['memory_bytes']) / 1e9:g} GB" in stated.replace(",", "")


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("H20", "H20"),
        ("h200", "H200-141GB"),
        ("H100 NVL", "H100-NVL"),
        ("h100_pcie", "H100-PCIe"),
        ("GeForce RTX 5090", "RTX-5090"),
        ("trillium", "TPU-v6e"),
        ("gaudi3", "Gaudi-3"),
    ],
)
def test_names_and_aliases(spelling: str, name: str) -> None:
    assert get_gpu(spelling).name == name


def test_h20_is_not_an_h200() -> None:
    assert get_gpu("H20").memory_bytes == 96 * 10**9
    assert get_gpu("H200").memory_bytes == 141 * 10**9


@pytest.mark.parametrize(
    ("spelling", "candidates"),
    [
        ("H100", "H100-80GB, H100-PCIe, H100-NVL"),
        ("A100", "A100-40GB, A100-80GB"),
        ("GH200", "GH200-96GB, GH200-141GB"),
    ],
)
def test_shared_aliases_are_ambiguous(spelling: str, candidates: str) -> None:
    with pytest.raises(ConfigError, match=f"ambiguous: it could be {candidates}"):
        get_gpu(spelling)


@pytest.mark.parametrize("spelling", ["H2", "H1", "B2", "MI3"])
def test_no_prefix_guesses(spelling: str) -> None:
    with pytest.raises(ConfigError, match="not in the GPU table; did you mean"):
        get_gpu(spelling)


def test_unknown_lists_close_matches() -> None:
    with pytest.raises(ConfigError) as info:
        get_gpu("H2OO")
    assert "H200-141GB" in str(info.value) and "H20" in str(info.value)


def _fake_torch(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    cuda = types.SimpleNamespace(
        is_available=lambda: available,
        mem_get_info=lambda device: ((70 - device) * 2**30, 80 * 2**30),
        get_device_name=lambda device: "NVIDIA H100 80GB HBM3",
        get_device_capability=lambda device: (9, 0),
    )
    version = types.SimpleNamespace(hip=None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda, version=version))


def test_local_reads_free_memory_through_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_torch(monkeypatch, available=True)
    gpu = get_gpu("local")
    assert gpu.vendor == LOCAL and gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.planning_memory_bytes == 70 * 2**30 and gpu.memory_bytes == 80 * 2**30
    assert gpu.planning_memory_source == "free memory now (torch)"
    assert gpu.compute_capability == (9, 0)
    second = get_gpu("local:1")
    assert second.variant == "cuda:1" and second.planning_memory_bytes == 69 * 2**30


def test_local_without_a_device_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_torch(monkeypatch, available=False)
    with pytest.raises(ConfigError, match="torch sees no CUDA/ROCm device"):
        get_gpu("local")


def test_local_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match="needs torch"):
        get_gpu("local")
