"""The package's shape: no import cycle inside airflow_provider_bos/, and no module over 700 lines.

Every ``import`` counts, wherever it is: under ``if TYPE_CHECKING:`` (a reader still has to follow
it) and inside a function (a cycle deferred to call time is still a cycle). Each check has an
allow-list of known offenders that may only shrink: a new offender fails, and so does an entry that
no longer offends (remove it from the list).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "airflow_provider_bos"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE
MAX_LINES = 700

# Import cycles known to exist, each as the set of modules of its strongly connected component.
KNOWN_CYCLES: set[frozenset[str]] = set()
# Modules known to be over MAX_LINES, as paths relative to the repository.
KNOWN_LONG_MODULES: set[str] = set()


def _module_files() -> dict[str, Path]:
    """Every module of the package by dotted name; a package's ``__init__.py`` is the package."""
    modules: dict[str, Path] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """The absolute dotted names ``module`` imports; ``from X import name`` gives ``X.name``, which
    is a submodule or an attribute of ``X`` (:func:`_resolve` tells them apart)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative: level 1 is the package the module is in (a package's own __init__ is in itself).
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            yield from (base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module ``name`` is, or is an attribute of (its longest module prefix); None outside."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports."""
    modules = _module_files()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {_resolve(name, modules) for name in _imported_names(module, path)}
        graph[module] = {target for target in targets if target is not None and target != module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's strongly connected components of more than one module: each one is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def one_cycle(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the modules along it."""
    start = min(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & component):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{sorted(component)} is not a cycle")


def _describe(graph: dict[str, set[str]], component: frozenset[str]) -> str:
    return f"  {{{', '.join(sorted(component))}}}\n    e.g. {' -> '.join(one_cycle(graph, component))}"


def test_no_import_cycle_inside_the_package() -> None:
    graph = import_graph()
    cycles = set(strongly_connected(graph))
    new = sorted(cycles - KNOWN_CYCLES, key=sorted)
    gone = sorted(KNOWN_CYCLES - cycles, key=sorted)
    problems: list[str] = []
    if new:
        problems.append(
            "Import cycles inside the package (every import counts, TYPE_CHECKING and function-level "
            "ones too); break each one (a Protocol the importer owns, a type moved to a lower module):\n"
            + "\n".join(_describe(graph, component) for component in new)
        )
    if gone:
        problems.append(
            "KNOWN_CYCLES lists cycles that no longer exist as listed; remove (or update) these entries:\n"
            + "\n".join(f"  {{{', '.join(sorted(component))}}}" for component in gone)
        )
    assert not problems, "\n\n".join(problems)


def test_no_module_over_700_lines() -> None:
    root = PACKAGE_DIR.parent
    long = {
        path.relative_to(root).as_posix(): lines
        for path in PACKAGE_DIR.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    new = sorted(set(long) - KNOWN_LONG_MODULES)
    gone = sorted(KNOWN_LONG_MODULES - set(long))
    problems: list[str] = []
    if new:
        problems.append(
            f"Modules over {MAX_LINES} lines; split each along its seams into modules of one concept:\n"
            + "\n".join(f"  {path}: {long[path]} lines" for path in new)
        )
    if gone:
        problems.append(
            f"KNOWN_LONG_MODULES lists modules that are no longer over {MAX_LINES} lines; remove these entries:\n"
            + "\n".join(f"  {path}" for path in gone)
        )
    assert not problems, "\n\n".join(problems)
