"""The default corpus lists the standard library's files in the order a full ``rglob`` and sort gives, lazily."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from biasviz.data import corpus


def reference(root: Path) -> list[Path]:
    """The listing as it was defined: every ``*.py`` under ``root``, skipped parts left out, sorted as strings."""
    found = [p for p in root.rglob("*.py") if not corpus.STDLIB_SKIP.intersection(p.relative_to(root).parts)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Names whose string order differs from a folder-by-folder walk: ``a-b.py`` and ``a.py`` before ``a/x.py``,
    ``d/e.py`` before ``d0.py``, a folder named ``b.py``, skipped folders, a linked folder, a hidden one."""
    files = ["a.py", "a-b.py", "a/x.py", "a/test/y.py", "a/z.txt", "b.py/c.py", "b.py-c.py", "B.py", "_z.py",
             "sub/__pycache__/q.py", "sub/deep/er/r.py", "site-packages/pkg/m.py", "tests.py", "d/e.py", "d.py",
             "d0.py", ".hidden/h.py", "\u00fc.py", "idlelib/i.py", "lib2to3x/k.py"]  # fmt: skip
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)  # rglob does not follow it
    (tmp_path / "link.py").symlink_to(tmp_path / "d.py")
    monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    return tmp_path


def test_order_and_selection_match_a_full_sorted_rglob(tree: Path) -> None:
    got = list(corpus._stdlib_files())
    assert got == reference(tree)
    names = [p.relative_to(tree).as_posix() for p in got]
    assert names.index("a-b.py") < names.index("a.py") < names.index("a/x.py") < names.index("b.py")
    assert names.index("d.py") < names.index("d/e.py") < names.index("d0.py") and "a/test/y.py" not in names


def test_skipped_and_unreached_folders_are_never_listed(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []
    scandir = os.scandir

    def counting(path: os.PathLike[str] | str) -> object:
        listed.append(Path(path).relative_to(tree).as_posix())
        return scandir(path)

    monkeypatch.setattr(corpus.os, "scandir", counting)
    first = next(corpus._stdlib_files())
    assert first == tree / ".hidden/h.py" and listed == [".", ".hidden"]
    list(corpus._stdlib_files())
    assert not {"site-packages", "sub/__pycache__", "a/test", "idlelib", "link"}.intersection(listed)


def test_the_real_standard_library_lists_as_before() -> None:
    assert list(corpus._stdlib_files()) == reference(Path(sysconfig.get_paths()["stdlib"]))


def test_a_missing_standard_library_is_an_empty_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path / "gone")})
    docs, _ = corpus.open_corpus(None)
    with pytest.raises(corpus.BiasvizError, match="holds no text"):
        list(docs)
