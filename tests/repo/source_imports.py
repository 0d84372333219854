"""The modules a Python file imports, read from its source with ``ast``: every import counts, those
under ``TYPE_CHECKING`` and inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path


def imports(path: Path) -> set[str]:
    """Each module ``path`` imports, and each name it imports from one as ``module.name`` (absolute
    imports only: the package imports itself absolutely)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found
