"""The documentation site: every public function on the API page and documented, every page in the navigation,
README a front page, and ``mkdocs build --strict`` offline: nothing on the built pages comes from another host."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import biasviz
from tests.docs_pages import DOCS, ROOT, site_pages

API = (DOCS / "api.md").read_text(encoding="utf-8")
DOCUMENTED = re.findall(r"^::: (\S+)$", API, re.M)


def resolve(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_public_function_of_biasviz_is_on_the_api_page() -> None:
    public = [n for n in biasviz.__all__ if n != "__version__"] + ["open"]
    for name in public:
        obj = getattr(biasviz, name)
        assert any(resolve(path) is obj for path in DOCUMENTED), name


@pytest.mark.parametrize("path", DOCUMENTED)
def test_everything_the_api_page_shows_has_a_docstring(path: str) -> None:
    obj = resolve(path)
    assert (obj.__doc__ or "").strip(), path
    if inspect.isclass(obj):
        for name, member in vars(obj).items():
            if name.startswith("_"):
                continue
            function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if inspect.isfunction(function):
                assert (function.__doc__ or "").strip(), f"{path}.{name}"


def test_every_page_is_in_the_navigation_and_readme_is_a_front_page() -> None:
    assert sorted(p.name for p in site_pages()) == sorted(p.name for p in DOCS.glob("*.md"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 150
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):  # README's links into the site's pages exist
        assert (ROOT / link).is_file(), link
    for page in site_pages():  # and so does every picture a page shows
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text(encoding="utf-8")):
            assert (page.parent / image).is_file(), (page.name, image)


def test_the_site_builds_strict_offline_in_seconds(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="needs the docs extra (make docs installs it)")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env)  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert took < 60, took
    site = tmp_path / "site"
    for page in site_pages():
        assert (site / page.with_suffix(".html").name).is_file(), page.name
    # what a browser would load: scripts, styles, images, fonts; links out are allowed, loads are not
    loads = re.compile(r"""(?:<(?:script|img|iframe|source)\b[^>]*\bsrc|<link\b[^>]*\bhref)=["']?(https?:)?//""")
    for html in site.glob("*.html"):
        assert not loads.search(html.read_text(encoding="utf-8")), html.name
    for css in site.rglob("*.css"):
        assert not re.search(r"@import|url\(\s*[\"']?(https?:)?//", css.read_text(encoding="utf-8")), css.name
    api = (site / "api.html").read_text(encoding="utf-8")
    for path in DOCUMENTED:  # every object rendered
        assert f'id="{path}"' in api, path
