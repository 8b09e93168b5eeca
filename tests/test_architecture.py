"""Layering guard: imports inside src/pagedkv only point down the layer table.

The table is the one in docs/ARCHITECTURE.md and DESIGN.md. A module's layer comes from
its path (``pagedkv/planning/x.py`` is in ``planning``). Every pagedkv import counts,
whether at module level, under ``if TYPE_CHECKING:`` or inside a function; a lazy import
of a lower layer is fine because lower layers are always allowed. The only upward imports
are the documented start-up hook (``bootstrap.py``, lazily), the registry's by-name
import of that hook, and ``pagedkv.planning``'s by-name lookup of the capacity report's
old names (ALLOW_LIST).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "pagedkv"

BOTTOM = frozenset({"errors", "dtypes", "config", "_version"})
# layer -> the other layers it may import (its own layer is always allowed).
ALLOWED: dict[str, frozenset[str]] = {
    "_version": frozenset(),
    "errors": frozenset(),
    "dtypes": frozenset({"errors"}),
    "config": frozenset({"errors", "dtypes"}),
    "registry": frozenset({"errors"}),
    "specs": BOTTOM | {"registry"},
    "platforms": BOTTOM | {"registry"},
    "bootstrap": BOTTOM | {"registry", "platforms"},
    "planning": BOTTOM | {"registry", "specs", "platforms", "planning.types"},
    # planning/types.py holds the result types the runtime reads: it imports no other planning.
    "planning.types": BOTTOM | {"registry", "specs", "platforms"},
    "runtime": BOTTOM | {"registry", "specs", "planning.types"},
    # the capacity report on a plan (what `pagedkv plan` prints), above the core planner.
    "capacity": BOTTOM | {"registry", "specs", "platforms", "planning"},
    # extension grouping rules / builders, selected by name; the core never imports them.
    "builders": BOTTOM | {"registry", "specs", "platforms", "planning", "capacity"},
    "models": BOTTOM | {"registry", "specs"},
    # "plan this model on that GPU with these flags": models + capacity, one call.
    "deployment": BOTTOM | {"registry", "specs", "platforms", "planning", "capacity", "models"},
    "tensors": BOTTOM | {"registry", "specs", "platforms", "planning", "runtime", "distributed"},
    "distributed": BOTTOM | {"registry", "specs", "platforms", "planning", "runtime", "tensors"},
    # Extensions above the core (the core never imports them): eviction policies and the
    # host tier; events may read the runtime's event types, cluster the events and the
    # runtime's hashing.
    "policies": BOTTOM | {"registry", "specs", "planning.types", "runtime"},
    "events": BOTTOM | {"runtime"},
    "cluster": BOTTOM | {"runtime", "events"},
    "sim": BOTTOM
    | {"registry", "specs", "platforms", "planning", "capacity", "runtime", "models", "deployment"}
    | {"policies", "cluster", "events"},
    # compat (extension): vLLM's module paths and names, translated onto the core (and
    # vLLM's worker allocation onto pagedkv's tensors).
    "compat": BOTTOM
    | {"registry", "specs", "platforms", "planning", "runtime", "events", "tensors"},
    # hf (extension): transformers models running on the plan, blocks and tensors.
    # (and `pagedkv serve`: it publishes events and shares the router's HTTP guards)
    "hf": BOTTOM
    | {"registry", "specs", "planning", "capacity", "runtime", "models", "tensors"}
    | {"events", "cluster"},
    "cli": BOTTOM
    | {"registry", "specs", "platforms", "planning", "capacity", "runtime", "models", "tensors"}
    | {"deployment"}
    | {"distributed", "sim", "bootstrap", "pagedkv", "hf", "policies", "events", "cluster"},
    # `python -m pagedkv` runs the CLI.
    "__main__": frozenset({"cli"}),
    # the package root is the public facade: it may re-export every layer (from events,
    # only the wire encoding, which needs no pyzmq).
    "pagedkv": BOTTOM
    | {"registry", "specs", "platforms", "planning", "capacity", "runtime", "models", "tensors"}
    | {"deployment"}
    | {"distributed", "sim", "bootstrap", "cli", "events"},
}

# Documented upward imports: (importing module, imported module) -> why it is allowed.
ALLOW_LIST: dict[tuple[str, str], str] = {
    # The start-up hook registers the runtime's built-in managers on the registry's first
    # query; it imports them inside register_all(), never at module level.
    ("pagedkv.bootstrap", "pagedkv.runtime.builtins"): "documented start-up hook",
    # pagedkv.planning still answers the capacity report's names (they lived there before
    # the report moved above the core), by name and only when one is asked for.
    ("pagedkv.planning", "pagedkv.capacity"): "compatibility names, resolved on first use",
}
LAZY_ONLY = {
    ("pagedkv.bootstrap", "pagedkv.runtime.builtins"),
    ("pagedkv.planning", "pagedkv.capacity"),
}

# Heavy third-party packages: where they may be imported, and whether only lazily.
HEAVY: dict[str, tuple[frozenset[str], bool]] = {
    "torch": (frozenset({"tensors", "distributed", "models", "hf"}), False),
    "numpy": (frozenset({"tensors", "distributed"}), False),
    "transformers": (frozenset({"models", "hf"}), True),
    "matplotlib": (frozenset({"sim", "cli"}), True),
    "zmq": (frozenset({"events", "cluster", "cli"}), False),
    # the route service (cluster/service.py, imported only by the route command) and
    # pagedkv serve's app (hf/server.py, imported only by the serve command)
    "starlette": (frozenset({"cluster", "hf"}), False),
    "prometheus_client": (frozenset({"cluster", "hf"}), False),
    "httpx": (frozenset({"cluster"}), False),
    "uvicorn": (frozenset({"cli"}), True),
}
# torch only inside functions / TYPE_CHECKING there (models: `--gpu local` reads the device).
LAZY_IN = {"distributed", "models"}


class Import(NamedTuple):
    module: str  # importing module, e.g. "pagedkv.planning.planner"
    target: str  # imported module, e.g. "pagedkv.specs.base" or "torch"
    lineno: int
    where: str  # "module", "type-checking" or "function"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """Layer from the path: pagedkv.<first part>, or the root package itself."""
    parts = module.split(".")
    if parts[0] != "pagedkv":
        raise ValueError(module)
    if len(parts) == 1:
        return "pagedkv"
    if parts[1] == "planning" and len(parts) > 2 and parts[2] == "types":
        return "planning.types"
    return parts[1]


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool, src: Path) -> list[str]:
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        stem = ".".join([*base, node.module] if node.module else base)
    else:
        stem = node.module or ""
    targets = []
    for alias in node.names:
        sub = f"{stem}.{alias.name}"
        sub_path = src.joinpath(*sub.split("."))
        is_module = sub_path.with_suffix(".py").exists() or (sub_path / "__init__.py").exists()
        targets.append(sub if is_module else stem)
    return targets


@functools.cache
def collect_imports(path: Path, src: Path) -> tuple[Import, ...]:
    module = module_name(path, src)
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                inner = "function"
            elif isinstance(child, ast.If) and _is_type_checking(child.test) and where == "module":
                inner = "type-checking"
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, where) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                for target in _resolve(child, module, is_package, src):
                    found.append(Import(module, target, child.lineno, where))
            elif (
                isinstance(child, ast.Call)
                and ast.unparse(child.func) in {"importlib.import_module", "import_module"}
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                found.append(Import(module, child.args[0].value, child.lineno, where))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), "module")
    return tuple(found)


def layer_violations(src: Path, allow_list: dict[tuple[str, str], str]) -> list[str]:
    problems = []
    for path in sorted((src / "pagedkv").rglob("*.py")):
        for imp in collect_imports(path, src):
            if imp.target.split(".")[0] != "pagedkv":
                continue
            source, target = layer_of(imp.module), layer_of(imp.target)
            ok = source == target or target in ALLOWED[source]
            if target == "planning.types" and "planning" in ALLOWED[source]:
                ok = True  # whoever may use planning may use its types
            key = (imp.module, imp.target)
            if not ok and key in allow_list:
                ok = key not in LAZY_ONLY or imp.where == "function"
            if not ok:
                where = f"{path.relative_to(src.parent)}:{imp.lineno}"
                problems.append(
                    f"{where}: {imp.module} ({source}) imports {imp.target} ({target}) "
                    f"at {imp.where} level"
                )
    return problems


def heavy_violations(src: Path) -> list[str]:
    problems = []
    for path in sorted((src / "pagedkv").rglob("*.py")):
        for imp in collect_imports(path, src):
            heavy = HEAVY.get(imp.target.split(".")[0])
            if heavy is None:
                continue
            layers, lazy = heavy
            layer = layer_of(imp.module)
            lazy = lazy or layer in LAZY_IN
            if layer not in layers or (lazy and imp.where == "module"):
                where = f"{path.relative_to(src.parent)}:{imp.lineno}"
                problems.append(f"{where}: {imp.module} imports {imp.target} at {imp.where} level")
    return problems


@pytest.mark.slow
def test_imports_only_point_down_the_layer_table() -> None:
    problems = layer_violations(SRC, ALLOW_LIST)
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_heavy_packages_stay_in_their_layers() -> None:
    problems = heavy_violations(SRC)
    assert not problems, "heavy imports out of place:\n" + "\n".join(problems)


def test_allow_list_entries_are_still_needed() -> None:
    stale = [key for key in ALLOW_LIST if not any(layer_violations(SRC, _without(ALLOW_LIST, key)))]
    assert not stale, f"allow-list entries no longer needed, remove them: {stale}"


def test_registry_imports_only_the_bootstrap_by_name() -> None:
    tree = ast.parse((PACKAGE / "registry.py").read_text())
    names = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("pagedkv.")
    }
    assert names <= {"pagedkv.bootstrap"}, names


def test_core_names_the_builders_extension_only_in_the_rule_table() -> None:
    # The core selects pagedkv.builders by name (config.KV_CACHE_GROUPING_RULES), never imports it.
    core = [PACKAGE / f"{m}.py" for m in ("dtypes", "config", "errors", "registry", "platforms")]
    for package in ("specs", "planning", "runtime"):
        core += sorted((PACKAGE / package).rglob("*.py"))
    naming = [p.relative_to(PACKAGE) for p in core if "pagedkv.builders" in p.read_text()]
    assert naming == [Path("config.py")], naming
    assert not [
        i for p in core for i in collect_imports(p, SRC) if i.target.startswith("pagedkv.builders")
    ]


def test_every_package_directory_has_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        assert layer_of(module_name(path, SRC)) in ALLOWED, path


def _without(allow: dict[tuple[str, str], str], key: tuple[str, str]) -> dict:
    return {k: v for k, v in allow.items() if k != key}


# --- the checker itself must catch what it is meant to catch ---


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "pagedkv" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in [tmp_path / "pagedkv", *(tmp_path / "pagedkv").rglob("*")]:
        if d.is_dir() and not (d / "__init__.py").exists():
            (d / "__init__.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"specs/a.py": "from pagedkv.planning import plan\n"}, "specs/a.py:1"),
        ({"runtime/a.py": "from pagedkv.planning.planner import x\n"}, "runtime/a.py:1"),
        ({"registry.py": "def f():\n    from pagedkv.specs import base\n"}, "registry.py:2"),
        ({"models/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
          "    from pagedkv.runtime import x\n"}, "models/a.py:3"),
        ({"planning/a.py": "from ..runtime import block_pool\n"}, "planning/a.py:1"),
        ({"sim/a.py": "import pagedkv.cli\n"}, "sim/a.py:1"),
        ({"planning/types.py": "from pagedkv.planning.planner import x\n"},
         "planning/types.py:1"),
        ({"bootstrap.py": "from pagedkv.runtime.builtins import r\n"}, "bootstrap.py:1"),
        ({"specs/a.py": "import importlib\nimportlib.import_module('pagedkv.sim')\n"},
         "specs/a.py:2"),
    ],
)  # fmt: skip
def test_checker_flags_upward_imports(tmp_path: Path, files: dict, expected: str) -> None:
    problems = layer_violations(_fake_tree(tmp_path, files), ALLOW_LIST)
    assert len(problems) == 1 and f"/pagedkv/{expected}:" in problems[0], problems


def test_checker_accepts_downward_and_lazy_lower_imports(tmp_path: Path) -> None:
    files = {
        "runtime/a.py": "from pagedkv.planning.types import KVCacheConfig\n"
        "def f():\n    from pagedkv.specs import base\n",
        "planning/a.py": "from .types import x\nfrom pagedkv.platforms import p\n",
        "bootstrap.py": "def f():\n    from pagedkv.runtime.builtins import r\n",
        "sim/a.py": "from pagedkv import models\n",
        "models/__init__.py": "",
    }
    assert layer_violations(_fake_tree(tmp_path, files), ALLOW_LIST) == []


def test_checker_flags_heavy_imports(tmp_path: Path) -> None:
    files = {
        "planning/a.py": "import torch\n",
        "models/a.py": "import transformers\n",
        "sim/a.py": "def f():\n    import matplotlib\n",
    }
    problems = heavy_violations(_fake_tree(tmp_path, files))
    flagged = [p.split(":")[0].split("/pagedkv/")[1] for p in problems]
    assert flagged == ["models/a.py", "planning/a.py"], problems


# --- no import circles, whatever kind of import closes them ---


def import_graph(src: Path) -> dict[str, set[str]]:
    """pagedkv module -> the pagedkv modules it imports (module level, under
    ``TYPE_CHECKING`` or inside a function; a package counts as its ``__init__``)."""
    modules = {module_name(p, src) for p in (src / "pagedkv").rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in (src / "pagedkv").rglob("*.py"):
        source = module_name(path, src)
        for imp in collect_imports(path, src):
            target = imp.target
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # an attribute of a module
            if target in modules and target != source:
                graph[source].add(target)
    return graph


def import_circles(src: Path) -> list[list[str]]:
    """Every strongly connected group of modules (Tarjan), each as a closed path."""
    graph = import_graph(src)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                circles.append(_closed_path(graph, set(members)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def _closed_path(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """One cycle through the smallest member, for the error message."""
    start = min(members)
    paths = [[start]]
    seen = {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph[path[-1]] & members):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append([*path, nxt])
    return sorted(members)


def test_no_import_circles() -> None:
    circles = import_circles(SRC)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize(
    ("files", "circle"),
    [
        ({"cli/app.py": "from pagedkv.cli import plan\n",
          "cli/plan.py": "def f():\n    from pagedkv.cli.app import app\n"},
         ["pagedkv.cli.app", "pagedkv.cli.plan", "pagedkv.cli.app"]),
        ({"sim/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
          "    from pagedkv.sim.c import C\n",
          "sim/b.py": "from .a import x\n", "sim/c.py": "from pagedkv.sim.b import y\n"},
         ["pagedkv.sim.a", "pagedkv.sim.c", "pagedkv.sim.b", "pagedkv.sim.a"]),
        ({"runtime/__init__.py": "from pagedkv.runtime.pool import Pool\n",
          "runtime/pool.py": "from pagedkv.runtime import Request\n"},
         ["pagedkv.runtime", "pagedkv.runtime.pool", "pagedkv.runtime"]),
    ],
)  # fmt: skip
def test_checker_finds_import_circles(tmp_path: Path, files: dict, circle: list[str]) -> None:
    assert import_circles(_fake_tree(tmp_path, files)) == [circle]


def test_checker_accepts_one_way_imports(tmp_path: Path) -> None:
    files = {
        "cli/app.py": "from pagedkv.cli import plan\n",
        "cli/plan.py": "from pagedkv.planning import x\n",
        "planning/__init__.py": "from pagedkv.planning.builder import x\n",
        "planning/builder.py": "from pagedkv.planning.types import T\n",
        "planning/types.py": "from pagedkv.specs import base\n",
        "specs/base.py": "",
    }
    assert import_circles(_fake_tree(tmp_path, files)) == []
