"""How far a reader has to follow ``pagedkv plan MODEL``: files, functions, planning passes.

Runs the command in-process under ``sys.setprofile`` (the CLI modules imported first,
as the console script does before dispatching) and prints JSON: distinct pagedkv
files and functions entered, Python calls into pagedkv, switches from one pagedkv file
to another, and how many planning passes ran (calls of the planner's entry point).

    python benchmarks/profile_plan.py [MODEL] [--all-files]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

# One planning pass is one call of the planner's entry point: plan_kv_cache in
# planning/plan.py before issue 14, then in planning/planner.py; plan_kv_cache_configs
# since the capacity report moved to pagedkv.capacity.
PASS_FUNCTIONS = {
    ("planning/plan.py", "plan_kv_cache"),
    ("planning/planner.py", "plan_kv_cache"),
    ("planning/planner.py", "plan_kv_cache_configs"),
}


def profile(model: str, all_files: bool) -> dict[str, Any]:
    import pagedkv
    from pagedkv.cli.app import main

    root = str(Path(pagedkv.__file__).parent) + "/"
    files: dict[str, int] = {}
    functions: set[tuple[str, str]] = set()
    counts = {"calls": 0, "file_switches": 0, "planning_passes": 0}
    last = [""]

    def tracer(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(root) and not all_files:
            return
        rel = path.removeprefix(root)
        files[rel] = files.get(rel, 0) + 1
        functions.add((rel, frame.f_code.co_name))
        counts["calls"] += 1
        if rel != last[0]:
            counts["file_switches"] += 1
            last[0] = rel
        if (rel, frame.f_code.co_name) in PASS_FUNCTIONS:
            counts["planning_passes"] += 1

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sys.setprofile(tracer)
        try:
            code = main(["plan", model])
        finally:
            sys.setprofile(None)
    return {
        "model": model,
        "exit_code": code,
        "files": len(files),
        "functions": len(functions),
        **counts,
        "files_by_calls": dict(sorted(files.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default="gemma-3-27b-it")
    parser.add_argument("--all-files", action="store_true", help="count non-pagedkv files too")
    args = parser.parse_args()
    print(json.dumps(profile(args.model, args.all_files), indent=1))


if __name__ == "__main__":
    main()
