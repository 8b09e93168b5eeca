"""The CLI's command modules never import the app; app.py registers every command."""

from __future__ import annotations

import ast
from pathlib import Path

import pagedkv.cli
from pagedkv.cli.app import app

CLI_DIR = Path(pagedkv.cli.__file__).parent
# The app itself and the console-script entry point that runs it.
ENTRY_POINTS = {"app.py", "__init__.py"}


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_command_module_imports_the_app() -> None:
    offenders = [
        path.name
        for path in CLI_DIR.glob("*.py")
        if path.name not in ENTRY_POINTS and "pagedkv.cli.app" in _imported_modules(path)
    ]
    assert offenders == []


def test_app_registers_the_commands() -> None:
    names = {command.name for command in app.registered_commands}
    assert {"plan", "simulate", "models", "gpus"} <= names
