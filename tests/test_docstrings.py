"""Docstring guard: public functions with more than three parameters document them.

A public function or method (its name does not start with ``_``; ``__init__`` counts,
as do methods of public classes) that takes more than three parameters, ``self`` and
``cls`` aside, must carry a Google-style ``Args:`` section naming every one of them.
A class documents its ``__init__`` parameters in the class docstring (Google style);
an ``Args:`` section in the ``__init__`` docstring is accepted too. ``*args`` and
``**kwargs`` need no entry. A command-line parameter whose ``typer.Option`` or
``typer.Argument`` carries ``help=`` text is documented there (what ``--help`` shows);
a command documents the others in its docstring after a form feed (``\\f``), which hides
the section from ``--help``. ``compat/`` is skipped: its names and docstrings follow vLLM's.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pagedkv"
SKIPPED_DIRS = frozenset({"compat"})
MAX_UNDOCUMENTED_PARAMS = 3

_ARGS_HEADER = re.compile(r"^(\s*)Args:\s*$", re.MULTILINE)
_SECTION_HEADER = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")


class Offender(NamedTuple):
    path: str  # under src/pagedkv
    qualname: str
    line: int
    missing: tuple[str, ...]  # parameters the Args section does not name

    def describe(self) -> str:
        names = ", ".join(self.missing)
        return f"src/pagedkv/{self.path}:{self.line} {self.qualname}: no Args entry for {names}"


def documented_names(docstring: str) -> set[str]:
    """The parameter names listed in a docstring's ``Args:`` section(s)."""
    names: set[str] = set()
    lines = docstring.splitlines()
    for start, line in enumerate(lines):
        header = _ARGS_HEADER.match(line)
        if header is None:
            continue
        header_indent = len(header.group(1))
        entry_indent: int | None = None
        for entry in lines[start + 1 :]:
            stripped = entry.strip()
            if not stripped:
                continue
            indent = len(entry) - len(entry.lstrip())
            if indent <= header_indent or _SECTION_HEADER.match(stripped):
                break
            if entry_indent is None:
                entry_indent = indent
            if indent == entry_indent:
                name = stripped.split(":", 1)[0].split(" (", 1)[0].lstrip("*")
                names.add(name)
    return names


def parameter_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return [arg.arg for arg in named if arg.arg not in ("self", "cls")]


def typer_help_names(relative: str, qualname: str) -> set[str]:
    """Parameters of a function whose default is a typer option or argument with help text."""
    if "typer" not in (PACKAGE / relative).read_text(encoding="utf-8"):
        return set()
    from typer.models import ParameterInfo

    module = importlib.import_module("pagedkv." + relative.removesuffix(".py").replace("/", "."))
    function: object = module
    for part in qualname.split("."):
        function = getattr(function, part)
    assert callable(function), qualname
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if isinstance(parameter.default, ParameterInfo) and parameter.default.help
    }


def is_public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def offenders_in(path: Path, root: Path = PACKAGE) -> Iterator[Offender]:
    relative = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def visit(node: ast.AST, owner: ast.ClassDef | None, prefix: str) -> Iterator[Offender]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                yield from visit(child, child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if not is_public(child.name):
                    continue
                params = parameter_names(child)
                if len(params) <= MAX_UNDOCUMENTED_PARAMS:
                    continue
                documented = documented_names(ast.get_docstring(child) or "")
                if owner is not None and child.name == "__init__":
                    documented |= documented_names(ast.get_docstring(owner) or "")
                missing = tuple(name for name in params if name not in documented)
                if missing and root == PACKAGE:
                    documented |= typer_help_names(relative, prefix + child.name)
                    missing = tuple(name for name in missing if name not in documented)
                if missing:
                    yield Offender(relative, prefix + child.name, child.lineno, missing)

    yield from visit(tree, None, "")


def all_offenders() -> list[Offender]:
    found: list[Offender] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if SKIPPED_DIRS.intersection(path.relative_to(PACKAGE).parts[:-1]):
            continue
        found.extend(offenders_in(path))
    return found


@pytest.mark.slow
def test_public_functions_document_their_parameters() -> None:
    offenders = all_offenders()
    assert not offenders, "public functions lacking Args entries:\n" + "\n".join(
        offender.describe() for offender in offenders
    )


def test_checker_reads_args_sections() -> None:
    docstring = """Summary.

    Args:
        num_tokens: tokens in the prompt.
        block_size (int): tokens per block,
            continued on a second line: not an entry.
        *extra: ignored.

    Returns:
        not_a_param: a Returns entry is no Args entry.
    """
    assert documented_names(docstring) == {"num_tokens", "block_size", "extra"}
    assert documented_names("Summary without sections.") == set()


def test_checker_flags_a_missing_entry(tmp_path: Path) -> None:
    source = '''
class Thing:
    """A thing.

    Args:
        a: first.
        b: second.
        c: third.
    """

    def __init__(self, a: int, b: int, c: int, d: int) -> None:
        pass

    def method(self, a: int, b: int, c: int) -> None:
        pass


def public(a: int, b: int, c: int, d: int) -> None:
    """Summary only."""


def documented(a: int, b: int, c: int, d: int, *rest: int) -> None:
    """Summary.

    Args:
        a: first.
        b: second.
        c: third.
        d: fourth.
    """


def _private(a: int, b: int, c: int, d: int) -> None:
    pass
'''
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    found = [(offender.qualname, offender.missing) for offender in offenders_in(path, tmp_path)]
    assert found == [("Thing.__init__", ("d",)), ("public", ("a", "b", "c", "d"))]


def test_typer_help_counts_as_documentation() -> None:
    named = typer_help_names("cli/serve.py", "serve_command")
    assert {"model", "tiny", "data_parallel_rank"} <= named
    assert "port" not in named  # no help= text: documented in the docstring instead
    assert typer_help_names("config.py", "check_int") == set()
