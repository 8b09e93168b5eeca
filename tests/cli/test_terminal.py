"""Terminal and packaging basics: version, python -m, completion, 80 columns, notebooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagedkv.cli.app import main

from .test_plan_cli import run

ENV = {**os.environ, "PAGEDKV_TRANSFORMERS": "0"}


@pytest.mark.slow
def test_version_and_python_dash_m() -> None:
    from pagedkv import __version__

    command = [sys.executable, "-m", "pagedkv", "--version"]
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"pagedkv {__version__}"


@pytest.mark.slow
def test_shell_completion_completes_commands_and_flags() -> None:
    env = {**ENV, "_PAGEDKV_COMPLETE": "complete_bash", "COMP_CWORD": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "from pagedkv.cli import main; main()"],
        capture_output=True,
        text=True,
        env={**env, "COMP_WORDS": "pagedkv si"},
        timeout=120,
    )
    assert proc.stdout.split() == ["simulate"]
    env |= {"COMP_WORDS": "pagedkv plan --tensor-p", "COMP_CWORD": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", "from pagedkv.cli import main; main()"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "--tensor-parallel-size" in proc.stdout.split()


@pytest.mark.parametrize(
    ("args", "must_show"),
    [
        (["plan"], ["sliding_window", "full_attention", "15.63 GiB", "131,072"]),
        (["models"], ["c4ai-command-r7b-12", "Qwen3-Next-80B-A3B-"]),
        (["gpus"], ["RTX-6000-Ada", "GH200-141GB"]),
        (["plan", "--help"], ["--tensor-parallel-size", "--kv-cache-memory-bytes"]),
        (["simulate", "--help"], ["--prefix-caching-hash-algo", "--num-gpu-blocks-override"]),
        (["simulate", "--num-blocks", "400", "--limit", "5", "--trace", "synthetic:5:1"],
         ["rejected (prompt >= max_model_len)", "400 x 16 tokens"]),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_tables_fit_80_columns_when_piped(args: list[str], must_show: list[str]) -> None:
    proc = run(*args, env={**ENV, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in proc.stdout  # nothing cut, only wrapped
    for text in must_show:
        assert text in proc.stdout, text


@pytest.mark.slow
def test_columns_is_honoured_when_piped() -> None:
    proc = run("plan", env={**ENV, "COLUMNS": "140"})
    assert max(len(line) for line in proc.stdout.splitlines()) > 80


def test_json_and_pipes_stay_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--num-blocks", "400", "--limit", "5", "--trace", "synthetic:5:1"]
    assert main([*args, "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and json.loads(out.out)["requests"] == 5


def test_progress_shows_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedkv.cli import progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert progress.progress_enabled(json_output=False)
    assert not progress.progress_enabled(json_output=True)
    seen: list[int] = []
    with progress.phase("working", 3, enabled=True) as bar:
        for done in range(1, 4):
            bar(done)
            seen.append(done)
        bar.stage("computing the bound")
    assert seen == [1, 2, 3]


def test_simulate_announces_the_bound_phase() -> None:
    from pagedkv.sim.run import simulate
    from pagedkv.sim.setup import setup_from_model
    from pagedkv.sim.traces.bundled import load_trace

    stages: list[str] = []
    setup = setup_from_model("Llama-3.1-8B", num_blocks=300)
    simulate(setup, load_trace("synthetic:5:1"), bound=True, stage=stages.append)
    assert stages == ["bound"]


def test_notebook_reprs_and_dataframes() -> None:
    from pagedkv.cli.plan import PlanOptions, make_plan
    from pagedkv.sim.reports.metrics import STEP_COLUMNS
    from pagedkv.sim.run import simulate, sweep_dataframe
    from pagedkv.sim.setup import setup_from_model
    from pagedkv.sim.traces.bundled import load_trace

    plan = make_plan(
        PlanOptions(model="Llama-3.1-8B", kv_cache_memory="4GiB", max_model_len=8192)
    ).kv_cache
    html = plan._repr_html_()
    assert "<table>" in html and f"{plan.num_blocks:,}" in html
    assert dict(plan.__rich_repr__())["num_blocks"] == plan.num_blocks
    setup = setup_from_model("Llama-3.1-8B", num_blocks=300)
    result = simulate(setup, load_trace("synthetic:5:1"), keep_steps=True)
    assert "hit rate (tokens)" in result._repr_html_()
    assert result.step_rows is not None and len(result.step_rows) == result.steps
    assert all(len(row) == len(STEP_COLUMNS) for row in result.step_rows)
    assert "step_rows" not in result.to_dict()
    pd = pytest.importorskip("pandas")
    frame = result.to_dataframe()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == list(STEP_COLUMNS)
    assert len(sweep_dataframe([])) == 0


def test_dataframe_without_pandas_or_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedkv.errors import ConfigError
    from pagedkv.sim.run import simulate
    from pagedkv.sim.setup import setup_from_model
    from pagedkv.sim.traces.bundled import load_trace

    result = simulate(setup_from_model("Llama-3.1-8B", num_blocks=300), load_trace("synthetic:3"))
    with pytest.raises(ConfigError, match="keep_steps=True"):
        result.to_dataframe()
    monkeypatch.setitem(sys.modules, "pandas", None)
    kept = simulate(
        setup_from_model("Llama-3.1-8B", num_blocks=300),
        load_trace("synthetic:3"),
        keep_steps=True,
    )
    with pytest.raises(ConfigError, match="needs pandas"):
        kept.to_dataframe()


def test_plot_library_calls_return_figures_without_a_global_backend() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    from pagedkv.cli.plan import PlanOptions, make_plan
    from pagedkv.cli.plan_render import concurrency_figure
    from pagedkv.sim.reports.plot import sweep_figure
    from pagedkv.sim.run import SweepPoint

    backend = matplotlib.get_backend()
    result = make_plan(
        PlanOptions(model="Llama-3.1-8B", kv_cache_memory="4GiB", max_model_len=8192)
    )
    fig = concurrency_figure(result)
    points = [SweepPoint(100, 0.1, 0.2, 0), SweepPoint(200, 0.2, 0.3, 0)]
    sweep = sweep_figure(points, title="t", block_size=16)
    assert fig.axes and sweep.axes
    assert matplotlib.get_backend() == backend


def test_summary_takes_an_extensions_rows_after_the_hit_rates() -> None:
    from pagedkv.cli.simulate_render import summary_table
    from pagedkv.sim.run import simulate
    from pagedkv.sim.setup import setup_from_model
    from pagedkv.sim.traces.bundled import load_trace

    result = simulate(setup_from_model("Llama-3.1-8B", num_blocks=300), load_trace("synthetic:3"))
    names = list(summary_table(result, [("host-tier hits", "5")]).columns[0].cells)
    at = names.index("host-tier hits")
    assert (
        names[at - 1] == "hit rate (requests with a hit)"
        and len(names) == len(result.summary_rows()) + 1
    )
