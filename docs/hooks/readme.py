"""mkdocs hook: the README is the site's home page and CONTRIBUTING.md a page of its own, their links
rewritten from the repository's layout to the site's (``docs/sections/x.md`` -> ``sections/x.md``;
files outside ``docs/`` -> the repository on the web is unknown offline, so their links become text)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"index.md": ROOT / "README.md", "contributing.md": ROOT / "CONTRIBUTING.md"}


def on_files(files: Files, config: Any) -> Files:
    """Add the README and CONTRIBUTING.md to the site as generated pages."""
    for name, source in PAGES.items():
        files.append(File.generated(config, name, content=site_links(source.read_text(encoding="utf-8"))))
    return files


def site_links(text: str) -> str:
    """Links of a page at the repository's root as the site sees them from its root."""
    text = re.sub(r"\]\(docs/", "](", text)
    return re.sub(r"\[([^\]]*)\]\((?!https?://|#|sections/|img/|index\.md|contributing\.md)([^)]+)\)", r"\1 (`\2`)", text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Links from a docs page to files outside ``docs/`` (results JSON, scripts) become text: the site holds only the docs."""
    return re.sub(r"\[([^\]]*)\]\((?:\.\./)+(?!docs/)([^)]+)\)", r"\1 (`\2`)", markdown)
