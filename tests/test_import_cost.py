"""Guard: `import pagedkv` stays light (no heavy packages, no optional layers, a bounded
number of its own modules).

Run in a fresh interpreter so whatever this test session already imported does not count.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN_PACKAGES = ("torch", "transformers", "matplotlib", "numpy")
FORBIDDEN_MODULES = (
    "pagedkv.sim",
    "pagedkv.cli",
    "pagedkv.tensors",
    "pagedkv.distributed",
    "pagedkv.builders",
)
PAGEDKV_MODULE_LIMIT = 100

_PROBE = """
import json, sys
{statement}
print(json.dumps(sorted(sys.modules)))
"""


def _probe(statement: str) -> list[str]:
    """The modules loaded after ``statement`` runs in a fresh interpreter."""
    code = _PROBE.format(statement=statement)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _offenders(modules: list[str]) -> list[str]:
    heavy = [m for m in modules if m.split(".")[0] in FORBIDDEN_PACKAGES]
    layers = [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_MODULES)]
    return sorted({m.split(".")[0] for m in heavy}) + layers


@pytest.mark.slow
def test_import_pagedkv_pulls_in_no_heavy_package_or_optional_layer() -> None:
    modules = _probe("import pagedkv")
    assert "pagedkv" in modules and "pagedkv.runtime" in modules  # the probe really imported
    assert _offenders(modules) == [], f"`import pagedkv` imported: {_offenders(modules)}"


@pytest.mark.slow
def test_first_registry_query_stays_light() -> None:
    # The first query runs the start-up hook (built-ins, platform, plugins): still no torch.
    modules = _probe("import pagedkv\npagedkv.KVCacheSpecRegistry.ensure_registered()")
    assert _offenders(modules) == [], f"start-up registration imported: {_offenders(modules)}"


@pytest.mark.slow
def test_default_plan_leaves_the_grouping_extension_unloaded() -> None:
    # vLLM's grouping is the core's; the least-waste search loads only when selected.
    plan = (
        "import pagedkv\nfrom pagedkv.planning.grouping import choose_kv_cache_groups as c\n"
        "s = pagedkv.SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64, "
        "sliding_window=128)\nf = pagedkv.FullAttentionSpec(block_size=16, num_kv_heads=4, "
        "head_size=64)\nspecs = {{'s': s, 'f': f}}\n"
        "assert len(c(pagedkv.EngineConfig(), specs).groups) == 2\n{extra}"
    )
    modules = _probe(plan.format(extra=""))
    assert _offenders(modules) == [], f"a default plan imported: {_offenders(modules)}"
    lw = "c(pagedkv.EngineConfig.create(kv_cache_grouping_rule='least-waste'), specs)"
    modules = _probe(plan.format(extra=lw))
    assert "pagedkv.builders.least_waste" in modules


@pytest.mark.slow
def test_import_pagedkv_loads_a_bounded_set_of_modules() -> None:
    # How much `import pagedkv` loads, counted (not timed): a new eager import of a whole
    # layer shows up here as dozens of modules.
    modules = _probe("import pagedkv")
    ours = [m for m in modules if m == "pagedkv" or m.startswith("pagedkv.")]
    assert len(ours) <= PAGEDKV_MODULE_LIMIT, f"`import pagedkv` loaded {len(ours)} modules"


@pytest.mark.slow
def test_probe_sees_a_heavy_import() -> None:
    # The guard can fail: a statement that imports a forbidden layer is reported.
    modules = _probe("import pagedkv.sim")
    assert "pagedkv.sim" in _offenders(modules)
