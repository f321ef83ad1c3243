"""What a module imports, read with Python's ast (an import-graph check, not a search of the source text): every
module an ``import`` or ``from ... import`` names, at any depth of the module (function-level imports count too), as
the dotted names Python resolves, aliases and all. Imports for type checkers alone, under ``if TYPE_CHECKING:``, do
not run and do not count."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path, at_import: bool = False) -> set[str]:
    """``from a.b import c as d`` gives ``a.b`` and ``a.b.c`` (c may be a module); ``import a.b as e`` gives ``a.b``.
    ``at_import``: only what importing the module runs (not the imports inside its functions)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []
        if at_import and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found
