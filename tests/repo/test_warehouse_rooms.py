"""The rooms of ``warehouse/`` import only the rooms below them (docs/architecture.md, "Inside warehouse/").

Read from the source with ``ast``: every import counts, those under ``TYPE_CHECKING`` and inside
functions too.
"""

from __future__ import annotations

from pathlib import Path

from tests.repo.source_imports import imports

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_bos" / "warehouse"
PREFIX = "airflow_provider_bos.warehouse"

# Each room and the rooms it may import (itself always). The writer is the module writer.py.
ALLOWED: dict[str, set[str]] = {
    "tables": set(),
    "dialects": {"tables"},
    "run": {"tables", "dialects"},
    "writer": {"tables", "dialects", "run"},
    "upkeep": {"tables", "dialects", "run", "writer"},
}


def _room(module: str) -> str | None:
    """The room of ``airflow_provider_bos.warehouse.<room>...`` (None: the package itself, or outside it)."""
    if not module.startswith(PREFIX + "."):
        return None
    return module[len(PREFIX) + 1:].split(".")[0]


def test_every_module_of_the_warehouse_is_in_a_room() -> None:
    top = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__"))
    assert top == ["__init__.py", "dialects", "run", "tables", "upkeep", "writer.py"]


def test_rooms_import_only_the_rooms_below_them() -> None:
    wrong: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        room = relative.parts[0].removesuffix(".py")
        if room == "__init__":
            continue  # the package's public face re-exports from every room
        for module in sorted(imports(path)):
            if module == PREFIX:  # the package's public face imports every room: from a room, a way back up
                wrong.append(f"{relative} ({room}) imports {PREFIX} itself")
                continue
            target = _room(module)
            if target is not None and target != room and target in ALLOWED and target not in ALLOWED[room]:
                wrong.append(f"{relative} ({room}) imports {module} ({target})")
    assert not wrong, "\n".join(wrong)
