"""A/B of the bench_hot_path cases: this tree against a git revision, in one process.

The revision's ``src/pagedkv`` is exported to a temporary folder as package
``pagedkv_ab`` (imports rewritten), so both runtimes load side by side; each case runs
alternately (A then B, B then A) on a fresh manager, timed in CPU time of this thread
(``time.thread_time``), which a shared machine's load disturbs far less than wall time.
Prints JSON: per layout and case the median and minimum microseconds per call of both
and the median of the per-round ratios (this tree / the revision).

    python benchmarks/ab_hot_path.py REV [--rounds 7] [--layouts llama,gemma] [--cases ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path

import bench_hot_path as bench_new


def _load_revision(rev: str, folder: Path) -> types.ModuleType:
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", root, "archive", rev, "src/pagedkv", "benchmarks/bench_hot_path.py"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "src" / "pagedkv").rename(folder / "pagedkv_ab")
    word = re.compile(r"\bpagedkv(?=[.\s])")
    for path in [*(folder / "pagedkv_ab").rglob("*.py"), folder / "benchmarks/bench_hot_path.py"]:
        path.write_text(word.sub("pagedkv_ab", path.read_text()))
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(
        "bench_ab", folder / "benchmarks/bench_hot_path.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rev")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layouts", default="llama,gemma")
    ap.add_argument("--cases", default=",".join(bench_new.CASES))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bench_old = _load_revision(args.rev, Path(tmp))
        clock = types.SimpleNamespace(perf_counter=time.thread_time)
        bench_old.time = bench_new.time = clock  # type: ignore[attr-defined]
        runs: dict[tuple[str, str, str], list[float]] = {}
        for r in range(args.rounds):
            for layout in args.layouts.split(","):
                for case in args.cases.split(","):
                    order = [("rev", bench_old), ("tree", bench_new)]
                    for name, module in order if r % 2 == 0 else order[::-1]:
                        fn, n = module.CASES[case]
                        runs.setdefault((layout, case, name), []).append(
                            module._timed(fn, layout, n) / 1000
                        )
    out: dict[str, dict[str, float]] = {}
    for layout in args.layouts.split(","):
        for case in args.cases.split(","):
            a, b = runs[(layout, case, "rev")], runs[(layout, case, "tree")]
            out[f"{layout}/{case}"] = {
                "rev_us_median": round(statistics.median(a), 2),
                "tree_us_median": round(statistics.median(b), 2),
                "rev_us_min": round(min(a), 2),
                "tree_us_min": round(min(b), 2),
                "ratio_median": round(statistics.median(y / x for x, y in zip(a, b)), 3),
            }
    print(json.dumps({"rev": args.rev, "rounds": args.rounds, "cases": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
