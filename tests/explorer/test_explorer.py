"""The package's own code (:mod:`biasviz.explorer`): an :class:`ExplorerPage` saved as a user's files are (kept unless
forced), shown inline in its own document and named in plain text; :func:`explore` refusing what it cannot explore
before anything is read."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.explorer import ExplorerPage, explore

PAGE = ExplorerPage('<!doctype html><title>x</title><script>let a = "<b>" && 1;</script><p>é</p>', 'a "page" <1>',
                    "2 layers")  # fmt: skip


def test_a_page_is_saved_and_an_existing_file_kept_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "new folder" / "page.html"
    assert PAGE.save(target) == target and target.read_text(encoding="utf-8") == PAGE.html
    target.write_text("the user's own")
    with pytest.raises(BiasvizError, match="already exists; pass --force"):
        PAGE.save(target)
    assert target.read_text() == "the user's own"
    PAGE.save(target, force=True)
    assert target.read_text(encoding="utf-8") == PAGE.html
    assert sorted(p.name for p in target.parent.iterdir()) == ["page.html"]  # no temporary left beside it


def test_inline_the_page_is_a_document_of_its_own_and_in_text_a_name() -> None:
    shown = PAGE._repr_html_()
    assert shown.startswith('<iframe srcdoc="') and shown.count("<script") == 0  # nothing of it runs in the notebook
    srcdoc = shown[len('<iframe srcdoc="') : shown.index('" title="')]
    assert html.unescape(srcdoc) == PAGE.html
    assert 'title="a &quot;page&quot; &lt;1&gt;"' in shown
    assert PAGE.nbytes == len(PAGE.html.encode("utf-8")) == len(PAGE.html) + 1  # é is two bytes
    assert repr(PAGE) == f"<ExplorerPage 'a \"page\" <1>': {PAGE.nbytes / 1e6:.2f} MB, 2 layers; .save(path) writes it>"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "logits"}, "kind must be one of .* or 'all', not 'logits'"),
    ({"max_mb": 0}, "the size budget must be a positive, finite number of MB, not 0"),
    ({"max_mb": float("nan")}, "positive, finite number of MB, not nan"),
    ({"max_mb": "5"}, r"max_mb must be a number of MB, not '5' \(str\)"),
    ({"input_ids": [[1, 2]]}, "input_ids are for a trace; a file holds its own token ids"),
])  # fmt: skip
def test_explore_refuses_before_reading(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(BiasvizError, match=message):
        explore(tmp_path / "absent.h5", **kwargs)


def test_explore_takes_a_path_or_a_trace() -> None:
    with pytest.raises(BiasvizError, match="explore takes a file path or a biasviz.trace, not int"):
        explore(3)
