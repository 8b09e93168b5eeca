"""Every bundled model through ``pagedkv plan`` under several option sets: a refactoring check.

Runs the CLI in-process and writes one JSON object (exit code, stdout, stderr per command
line), so two trees can be compared byte for byte:

    PYTHONPATH=<old tree>/src python benchmarks/plan_outputs.py old.json
    PYTHONPATH=src python benchmarks/plan_outputs.py new.json
    python benchmarks/plan_outputs.py --compare old.json new.json

Tables are printed 160 columns wide. Error lines count too: a refactor keeps them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from typing import Any

OPTION_SETS: list[list[str]] = [
    [],
    ["--json"],
    ["--json", "-tp", "2"],
    ["-tp", "4", "-pp", "2"],
    ["--json", "--grouping", "least-waste"],
    ["--max-model-len", "auto", "--json"],
    ["--kv-cache-dtype", "fp8", "--gpu", "H200"],
    ["--json", "--memory", "141GB", "-tp", "8", "--max-num-seqs", "64"],
    ["--gpu", "A100-40GB", "-pp", "4", "--max-groups", "3", "--grouping", "least-waste"],
    ["--json", "--memory", "40GiB", "--block-size", "32", "--context-len", "3000"],
    ["--kv-cache-memory-bytes", "8GiB", "--no-enable-prefix-caching", "--json"],
]
# Error paths and the catalog commands.
EXTRA: list[list[str]] = [
    ["plan", "no-such-model"],
    ["plan", "gemma-3-27b-it", "--block-size", "7"],
    ["plan", "gemma-3-27b-it", "--gpu", "H100"],
    ["plan", "Llama-3.1-8B", "--max-model-len", "1M"],
    ["models"],
    ["gpus"],
]


def run(argv: list[str]) -> dict[str, Any]:
    from pagedkv.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def collect() -> dict[str, dict[str, Any]]:
    from pagedkv.models import list_bundled_models

    lines = [["plan", m, *opts] for m in list_bundled_models() for opts in OPTION_SETS]
    return {" ".join(argv): run(argv) for argv in [*lines, *EXTRA]}


def compare(old_path: str, new_path: str) -> dict[str, Any]:
    with open(old_path, encoding="utf-8") as f:
        old = json.load(f)
    with open(new_path, encoding="utf-8") as f:
        new = json.load(f)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return {"compared": len(old.keys() & new.keys()), "differ": differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", nargs="?", help="write the outputs here")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = parser.parse_args()
    if args.compare:
        result = compare(*args.compare)
        print(json.dumps(result, indent=1))
        sys.exit(1 if result["differ"] else 0)
    if not args.out:
        parser.error("give OUT, or --compare OLD NEW")
    os.environ["COLUMNS"] = "160"
    outputs = collect()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(outputs, f, indent=1, sort_keys=True)
    ok = sum(1 for v in outputs.values() if v["code"] == 0)
    print(json.dumps({"command_lines": len(outputs), "exit_0": ok, "out": args.out}))


if __name__ == "__main__":
    main()
