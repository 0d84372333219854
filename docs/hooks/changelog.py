"""MkDocs hook: the Changelog page is CHANGELOG.md itself, so the release notes live in one file.

CHANGELOG.md links to pages as `docs/<page>.md` (right when read in the repository); on the site the
same pages are `<page>.md`, so that prefix is dropped. Strict mode then checks every link as usual.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
PAGE = "changelog.md"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return re.sub(r"\]\(docs/", "](", CHANGELOG.read_text(encoding="utf-8"))
