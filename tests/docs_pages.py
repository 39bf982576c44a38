"""The pages a reader follows: README.md, then the site's pages in the order of mkdocs.yml's navigation.

Tests that run the examples or check a fact read them through here, so that a command or a fact moved from
README into a page of the site is still run and checked.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def site_pages() -> list[Path]:
    """docs/*.md in the order of mkdocs.yml's ``nav`` (its ``- Title: page.md`` lines)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    return [DOCS / name for name in re.findall(r"^\s+- (?:[^\n]*?: )?([\w./-]+\.md)\s*$", nav, re.M)]


def pages() -> list[Path]:
    """README.md first (what a new user reads first), then the site's pages."""
    return [ROOT / "README.md", *site_pages()]


def text(name: str) -> str:
    """One page's text: ``text("README.md")``, ``text("schemes.md")``."""
    return (ROOT / name if name == "README.md" else DOCS / name).read_text(encoding="utf-8")


def blocks(language: str) -> list[tuple[str, str]]:
    """Every fenced block of ``language`` on every page, in reading order: (page name, code)."""
    found = []
    for page in pages():
        for code in re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            found.append((page.name, code))
    return found
