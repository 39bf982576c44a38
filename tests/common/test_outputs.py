"""Checks on an output's path before any work (:mod:`biasviz.common.outputs`): link loops found without raising,
one file however spelled (links, ``..``, hard links), an input never destroyed (named, inside an input folder, or
held by a folder to be replaced), an existing file replaced only with ``--force``, and a safe file-name stem."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.common.outputs import (
    STEM_MAX,
    appeared_meanwhile,
    check_inputs_kept,
    check_no_loop,
    check_output_file,
    file_stem,
    input_clash,
    input_path,
    link_loop,
    make_output_folder,
    resolved,
    same_file,
)


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    """``a`` -> ``b`` -> ``a``: a symbolic link loop."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a"


def test_link_loop_is_found_on_the_path_and_in_its_folders(tmp_path: Path, loop: Path) -> None:
    assert link_loop(loop) and link_loop(loop / "out.h5")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert not link_loop(tmp_path / "dangling") and not link_loop(tmp_path / "missing") and not link_loop(tmp_path)


def test_resolved_follows_links_and_stops_at_a_loop(tmp_path: Path, loop: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert resolved(tmp_path / "link" / ".." / "link" / "f") == (tmp_path / "real" / "f").resolve()
    assert resolved(loop) == Path(os.path.abspath(loop))  # no error raised


def test_check_no_loop_says_what_to_do(loop: Path) -> None:
    with pytest.raises(BiasvizError) as refused:
        check_no_loop(loop, "--figures")
    assert str(refused.value) == (f"{loop} is a symbolic link loop (too many levels of symbolic links); remove the "
                                  "link or choose another --figures")  # fmt: skip
    check_no_loop(loop.parent / "fine.h5")


def test_make_output_folder_makes_its_parents_or_says_why_not(tmp_path: Path, loop: Path) -> None:
    make_output_folder(tmp_path / "x" / "y" / "z")
    assert (tmp_path / "x" / "y" / "z").is_dir()
    make_output_folder(tmp_path / "x")  # there already: nothing to do
    (tmp_path / "file").write_text("")
    with pytest.raises(BiasvizError) as refused:
        make_output_folder(tmp_path / "file" / "sub", "--out-dir")
    assert str(refused.value) == (f"cannot create the output folder {tmp_path / 'file' / 'sub'}: "
                                  f"{os.strerror(errno.ENOTDIR)}; choose another --out-dir")  # fmt: skip
    with pytest.raises(BiasvizError, match="symbolic link loop"):
        make_output_folder(loop / "sub")


def test_same_file_however_spelled(tmp_path: Path) -> None:
    f = tmp_path / "f.txt"
    f.write_text("x")
    (tmp_path / "sym").symlink_to(f)
    os.link(f, tmp_path / "hard")
    (tmp_path / "d").mkdir()
    assert same_file(f, tmp_path / "sym") and same_file(f, tmp_path / "hard") and same_file(f, tmp_path / "d/../f.txt")
    assert not same_file(f, tmp_path / "d")
    assert same_file(tmp_path / "new.h5", tmp_path / "d" / ".." / "new.h5")  # neither there yet: by their paths
    assert not same_file(tmp_path / "new.h5", tmp_path / "other.h5")


def test_input_path_names_a_code_file_without_its_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code.py").write_text("")
    (tmp_path / "a:b").write_text("")
    assert input_path(None) is None and input_path("") is None
    assert input_path("code.py:make_model") == Path("code.py")
    assert input_path("a:b") == Path("a:b")  # a file whose name holds a colon is itself
    assert input_path("gone.py:f") == Path("gone.py:f")  # neither there: the text as given
    assert input_path(Path("code.py")) == Path("code.py")


def test_input_clash_finds_what_writing_would_destroy(tmp_path: Path) -> None:
    text = tmp_path / "texts"
    text.mkdir()
    (text / "a.txt").write_text("corpus")
    data = tmp_path / "data.h5"
    data.write_text("h5")
    (tmp_path / "alias.h5").symlink_to(data)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pt").write_text("w")
    inputs = [None, "", str(tmp_path / "missing.h5"), text, data, str(out / "model.pt") + ":factory"]
    assert input_clash(tmp_path / "alias.h5", inputs) == data  # named through a link
    assert input_clash(text / "a.txt", inputs) == text  # a file an input folder holds
    assert input_clash(text / "new.txt", inputs) is None  # not there yet: replaces nothing inside it
    assert input_clash(out, inputs) == out / "model.pt"  # a folder to be replaced holds an input
    assert input_clash(tmp_path / "fresh.h5", inputs) is None


def test_check_inputs_kept_says_which_way_an_input_would_go(tmp_path: Path) -> None:
    text = tmp_path / "texts"
    text.mkdir()
    (text / "a.txt").write_text("corpus")
    with pytest.raises(BiasvizError) as refused:
        check_inputs_kept(text / "a.txt", [text / "a.txt"], "--data")
    assert str(refused.value) == f"{text / 'a.txt'} is one of the input files; give another --data"
    with pytest.raises(BiasvizError) as refused:
        check_inputs_kept(text / "a.txt", [text])
    assert str(refused.value) == f"{text / 'a.txt'} is inside an input folder ({text}); give another --out"
    with pytest.raises(BiasvizError) as refused:
        check_inputs_kept(tmp_path, [text / "a.txt"])
    assert str(refused.value) == f"{tmp_path} holds an input ({text / 'a.txt'}); give another --out"
    check_inputs_kept(tmp_path / "new.h5", [text, None])


def test_check_output_file(tmp_path: Path) -> None:
    new = tmp_path / "new.h5"
    assert check_output_file(str(new)) == new and isinstance(check_output_file(str(new)), Path)
    old = tmp_path / "old.h5"
    old.write_text("")
    with pytest.raises(BiasvizError) as refused:
        check_output_file(old, option="--figure")
    assert str(refused.value) == f"{old} already exists; pass --force to overwrite it or choose another --figure"
    assert check_output_file(old, force=True) == old
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(BiasvizError, match="already exists"):
        check_output_file(tmp_path / "dangling")  # a link is there, even to nothing
    with pytest.raises(BiasvizError, match=r"is a folder; give a file path for --out$"):
        check_output_file(tmp_path, force=True)
    with pytest.raises(BiasvizError, match="is one of the input files"):
        check_output_file(old, [old], force=True)  # an input is refused even with --force


def test_appeared_meanwhile_says_it_was_kept(tmp_path: Path) -> None:
    err = appeared_meanwhile(tmp_path / "f.h5", "--summary")
    assert isinstance(err, BiasvizError)
    assert str(err) == (f"{tmp_path / 'f.h5'} already exists: it appeared while this run was writing it and was kept "
                        "as it is; pass --force to overwrite it or choose another --summary")  # fmt: skip


@pytest.mark.parametrize(("text", "want"), [
    ("kerple-log", "kerple-log"), ("../../etc/passwd", "_.._etc_passwd"), ("", "unnamed"), ("a/b\\c", "a_b_c"),
    ("...", "unnamed"), (".hidden", "hidden"), ("..x.", "x."), ("données é", "donn_es__"), ("a+b_c-1.0", "a+b_c-1.0"),
    ("\x00", "_"), ("/", "_"),
])  # fmt: skip
def test_file_stem_is_one_safe_component(text: str, want: str) -> None:
    assert file_stem(text) == want


def test_file_stem_is_at_most_80_characters() -> None:
    assert STEM_MAX == 80
    assert file_stem("x" * 200) == "x" * 80
    assert file_stem("." * 80 + "tail") == "unnamed"  # cut to dots only: nothing left
