"""The explorer page treats everything from outside as data, in a real browser (chromium through selenium).

File names, paths, HDF5 attributes, scheme names, titles and token strings reach the page. Each string of
:data:`INJECTIONS` goes into every one of those fields at once; the page must open, draw, read out a cell,
show the string as text (the same characters, never markup), run no script of its own and log no error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[dev]')")
from tests.explorer.test_page_browser import console_errors, driver, hover, open_page  # noqa: F401  (driver: fixture)

By = pytest.importorskip("selenium.webdriver.common.by").By

T = 16
#: Markup, script, template placeholders, HTML comments and entities, JS template syntax, line separators.
INJECTIONS = [
    "<script>window.__pwned = 1</script>",
    "<!--<script>",
    "</script><script>window.__pwned = 2</script>",
    "{{DATA}}",
    "{{JS}} {{TITLE}} {{CSS}}",
    '<img src=x onerror="window.__pwned = 3">',
    '"><svg onload=window.__pwned=4>',
    "${window.__pwned = 5}`",
    "&lt;b&gt; &amp; &#60;script&#62;",
    "line\u2028separator\u2029paragraph",
    "]]><![CDATA[ <?xml ?>",
    "' onmouseover='window.__pwned=6' x='",
]


def file_name(text: str) -> str:
    """The injection as one file-name component (a name cannot hold '/' or NUL)."""
    return text.replace("/", "\u2215").replace("\0", "") + ".h5"


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> list[tuple[str, Path]]:
    """One page per injection: A's name, scheme, title and recorded tokenizer, B's token strings hold it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    import biasviz

    root = tmp_path_factory.mktemp("hostile-page")
    vocab = {"[UNK]": 0, **{text: k + 1 for k, text in enumerate(INJECTIONS)}}
    tok_path = root / "tokenizer.json"
    Tokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(tok_path))
    ids = np.array([[k % (len(INJECTIONS) + 1) for k in range(T)]], np.int32)
    out = []
    for k, text in enumerate(INJECTIONS):
        folder = root / f"case{k}"
        folder.mkdir()
        a = make_bias_file(folder / file_name(text), text, n=1, heads=2, t=T, input_ids=ids,
                           attrs={"tokenizer": text, "model": text})  # fmt: skip
        b = make_bias_file(folder / f"B{file_name(text)}", text, n=1, heads=2, t=T, input_ids=ids,
                           attrs={"tokenizer": str(tok_path)})  # fmt: skip
        page = folder / "page.html"
        biasviz.explore(a, b).save(page)
        titled = folder / "titled.html"
        biasviz.explore(b, title=text).save(titled)
        out += [(text, page), (text, titled)]
    return out


@pytest.mark.parametrize("k", range(len(INJECTIONS)), ids=[repr(s)[:24] for s in INJECTIONS])
def test_every_field_shows_the_injection_as_text(driver: object, pages: list[tuple[str, Path]], k: int) -> None:  # noqa: F811
    for text, page in pages[2 * k : 2 * k + 2]:
        open_page(driver, page)
        assert driver.execute_script("return window.__pwned") is None, "a script from the data ran"
        assert driver.execute_script("return document.querySelectorAll('script').length") == 2
        assert driver.execute_script("return document.querySelectorAll('img, svg, iframe').length") == 0
        heading = driver.find_element(By.CSS_SELECTOR, "header h1").get_attribute("textContent")
        expected_name = file_name(text)[: -len(".h5")]
        if page.name == "titled.html":
            assert heading == text
        else:
            assert heading == f"biasviz explorer: {expected_name} vs B{expected_name}"
            meta = driver.find_element(By.ID, "meta").get_attribute("textContent")
            assert f"({text})" in meta and expected_name in meta, meta
            # B's tokens are the injections: the read-out shows them as the JSON strings they are
            from selenium.webdriver.support.ui import Select

            Select(driver.find_element(By.ID, "source")).select_by_value("B")
        canvas = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="1"]')
        i = k + 1  # input id k + 1 is injection k
        hover(driver, canvas, i, 0, region=(0, T, 0, T))
        readout = driver.find_element(By.ID, "readout").get_attribute("textContent")  # .text folds U+2028
        if page.name == "page.html":
            assert f"query {json.dumps(text, ensure_ascii=False)} (id {i})" in readout, readout
        assert driver.execute_script("return window.__pwned") is None
        assert console_errors(driver) == []


# -- the same cases through the notebook's inline form (ExplorerPage._repr_html_) ---------------------------------


@pytest.fixture(scope="module")
def inline_pages(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> list[Path]:
    """Per injection, a notebook-like page holding ``_repr_html_()`` of the page of a file named by it, whose scheme,
    recorded model and tokenizer hold it, titled by it; and whether the frame's document is the page, character
    for character (read back by Python's own HTML parser)."""
    from html.parser import HTMLParser

    import biasviz

    class Frames(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.srcdocs: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "iframe":
                self.srcdocs.append(dict(attrs)["srcdoc"] or "")

    root = tmp_path_factory.mktemp("hostile-inline")
    out = []
    for k, text in enumerate(INJECTIONS):
        folder = root / f"case{k}"
        folder.mkdir()
        a = make_bias_file(folder / file_name(text), text, n=1, heads=2, t=T, attrs={"tokenizer": text, "model": text})
        page = biasviz.explore(a, title=text)
        inline = page._repr_html_()
        parser = Frames()
        parser.feed(inline)
        assert parser.srcdocs == [page.html], text
        host = folder / "notebook.html"
        host.write_text(f"<!doctype html><html><body><p id='cell'>out[1]:</p>{inline}</body></html>", encoding="utf-8")
        out.append(host)
    return out


def test_every_field_reaches_the_inline_page_as_text(driver: object, inline_pages: list[Path]) -> None:  # noqa: F811
    from tests.explorer.test_page_browser import wait_for

    for text, host in zip(INJECTIONS, inline_pages, strict=True):
        driver.get(host.as_uri())
        assert driver.execute_script("return document.querySelectorAll('script, img, svg').length") == 0
        frames = driver.find_elements(By.TAG_NAME, "iframe")
        assert len(frames) == 1
        driver.switch_to.frame(frames[0])
        wait_for(driver, "return document.body.dataset.ready === '1'")
        assert driver.execute_script("return document.querySelectorAll('script').length") == 2
        assert driver.find_element(By.CSS_SELECTOR, "header h1").get_attribute("textContent") == text
        meta = driver.find_element(By.ID, "meta").get_attribute("textContent")
        assert f"({text})" in meta and file_name(text)[: -len(".h5")] in meta, meta
        assert driver.execute_script("return window.__pwned") is None
        driver.switch_to.default_content()
        assert driver.execute_script("return window.__pwned") is None, "a script from the data ran in the notebook"
        assert console_errors(driver) == []
