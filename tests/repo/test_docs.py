"""The docs as a newcomer meets them: the quickstart DAG runs as printed, the changelog page is CHANGELOG.md."""

from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)


def test_the_quickstart_dag_in_readme_and_docs_is_one_and_builds(tmp_path: Path) -> None:
    readme, index = _python_blocks(ROOT / "README.md")[0], _python_blocks(ROOT / "docs" / "index.md")[0]
    assert readme == index
    script = tmp_path / "quickstart.py"
    script.write_text(readme)

    names = runpy.run_path(str(script))

    sync, check = names["sync"], names["check"]
    assert sync.dag.dag_id == "bos_people"
    assert sync.downstream_task_ids == {check.task_id}
    assert check.sync_task_id == sync.task_id


def _changelog_hook():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("changelog_hook", ROOT / "docs" / "hooks" / "changelog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(src_uri: str) -> SimpleNamespace:
    return SimpleNamespace(file=SimpleNamespace(src_uri=src_uri))


def test_the_changelog_page_is_changelog_md_with_links_relative_to_docs() -> None:
    hook = _changelog_hook()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "](docs/" in changelog

    page = hook.on_page_markdown("placeholder", _page("changelog.md"), None, None)

    assert "](docs/" not in page
    assert page == changelog.replace("](docs/", "](")


def test_other_pages_pass_through_the_changelog_hook_unchanged() -> None:
    assert _changelog_hook().on_page_markdown("# Text", _page("index.md"), None, None) == "# Text"
