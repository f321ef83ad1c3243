"""The package's shape, kept: short functions, a loop with no engine-specific branch, no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "horovod_train"
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_no_function_is_longer_than_60_lines():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_the_loop_the_cli_and_the_file_helpers_know_nothing_of_elastic_horovod():
    for name in ("trainer.py", "cli.py", "files.py"):
        assert "elastic" not in (PACKAGE / name).read_text(), name


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Package modules ``path`` imports anywhere in it (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def test_no_import_cycle():
    found = modules()
    graph = {name: imports_of(path, set(found)) - {name} for name, path in found.items()}
    # A package imports its __init__'s own imports; a module importing its parent package is not a cycle.
    graph = {name: {dep for dep in deps if not name.startswith(f"{dep}.")} for name, deps in graph.items()}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in visiting:
            raise AssertionError("import cycle: " + " -> ".join([*visiting[visiting.index(name) :], name]))
        if name in done:
            return
        visiting.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
