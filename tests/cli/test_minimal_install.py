"""The README's first command installs only the core and the plot extra: the CLI must run
without click (typer vendors it), torch, transformers or numpy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

BLOCKED = ("click", "torch", "transformers", "numpy", "zmq", "starlette", "uvicorn", "ray")


def _run_blocked(argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        f"""
        import sys
        for name in {BLOCKED!r}:
            sys.modules[name] = None  # any import of it raises ImportError
        from pagedkv.cli.app import main
        sys.exit(main({argv!r}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_plan_runs_without_optional_packages() -> None:
    result = _run_blocked(["plan", "--json"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["num_blocks"] > 0


@pytest.mark.slow
def test_simulate_runs_without_optional_packages() -> None:
    result = _run_blocked(["simulate", "--limit", "20", "--bound", "--json"])
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["requests"] == 20
    assert out["bound_hit_rate"] >= out["hit_rate"]


@pytest.mark.slow
def test_blocking_works() -> None:
    result = _run_blocked(["gpus"])
    assert result.returncode == 0, result.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['click'] = None; import click"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0


@pytest.mark.slow
def test_fleet_simulation_runs_without_the_events_and_route_extras() -> None:
    result = _run_blocked(["simulate", "--limit", "20", "--replicas", "2", "--router", "prefix"])
    assert result.returncode == 0, result.stderr
    served = _run_blocked(["route", "serve", "--engines", "tcp://127.0.0.1:1"])
    assert served.returncode == 1 and "pip install 'pagedkv[route]'" in served.stderr
