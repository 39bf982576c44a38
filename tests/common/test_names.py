"""Names from outside as UTF-8 text (:mod:`biasviz.common.names`): a name's display form is valid UTF-8, tells it
apart from every other name and gives its bytes back; metadata text loses no surrogate to a writer that refuses it;
the terminal's streams print what they cannot encode escaped; and a path not UTF-8 has an alias that is."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from biasviz.common.names import ESCAPE, display_name, escaping_output, name_bytes, utf8_data, utf8_path, utf8_text

#: names as a file system holds them: UTF-8, Latin-1 bytes, backslashes, and text that looks like an escape
NAMES = [b"plain.txt", "données/a.txt".encode(), b"caf\xe9.txt", b"a\\b", b"a\\xe9", b"\\\\x", b"\xff\xfe",
         b"\\x" + b"\xe9", "日本".encode() + b"\x80", b"tab\there"]  # fmt: skip


@pytest.mark.parametrize(("name", "shown"), [
    ("données/a.txt", "données/a.txt"),  # valid UTF-8 without a backslash: kept as it is
    (b"caf\xe9.txt", "caf\\xe9.txt"),  # a byte that is not UTF-8: \xNN
    ("a\\b", "a\\\\b"),  # a backslash doubled, so that an escape is never ambiguous
    (Path("x") / os.fsdecode(b"\xe9"), "x/\\xe9"),
    ("\ud800", "\\ud800"),  # a lone surrogate made up in Python, not a decoded byte: \uNNNN
])  # fmt: skip
def test_display_name_is_worked_out_by_hand(name: str | bytes | Path, shown: str) -> None:
    assert display_name(name) == shown


@pytest.mark.parametrize("raw", NAMES)
def test_display_name_is_utf8_and_name_bytes_gives_the_name_back(raw: bytes) -> None:
    shown = display_name(raw)
    shown.encode("utf-8")  # a UTF-8 writer takes it
    assert display_name(os.fsdecode(raw)) == shown  # the bytes and Python's str of them are one name
    assert name_bytes(shown) == raw


def test_display_names_of_different_names_differ() -> None:
    """``b'a\\\\xe9'`` (a backslash, then x, e, 9) and ``b'a\\xe9'`` (one byte) must not be shown alike."""
    shown = [display_name(raw) for raw in NAMES]
    assert len(set(shown)) == len(NAMES)
    assert display_name(b"a\\xe9") == "a\\\\xe9" and display_name(b"a\xe9") == "a\\xe9"


def test_name_bytes_of_plain_text_is_its_utf8() -> None:
    assert name_bytes("données") == "données".encode() == b"donn\xc3\xa9es"
    assert name_bytes("\\ud800") == "\ud800".encode("utf-8", "surrogatepass")


@pytest.mark.parametrize(("text", "want"), [
    ("Error: cannot read a\\b", "Error: cannot read a\\b"),  # valid already: as it is, backslashes and all
    ("données", "données"),
    ("read caf" + os.fsdecode(b"\xe9") + ".txt", "read caf\\xe9.txt"),
    ("x\ud800y", "x\\ud800y"),
])  # fmt: skip
def test_utf8_text_writes_out_only_the_surrogates(text: str, want: str) -> None:
    assert utf8_text(text) == want
    want.encode("utf-8")


def test_utf8_data_reaches_every_string_keys_included() -> None:
    odd = os.fsdecode(b"\xe9")
    data = {odd: [odd, (1, odd)], "path": Path("a\\b"), "n": 3, "none": None, "ok": "é"}
    assert utf8_data(data) == {"\\xe9": ["\\xe9", [1, "\\xe9"]], "path": "a\\\\b", "n": 3, "none": None, "ok": "é"}


def test_the_escape_handler_writes_bytes_as_xnn_and_other_characters_backslashreplaced() -> None:
    text = "é" + os.fsdecode(b"\xff") + "\u202e" + "\U0001f600"
    assert text.encode("ascii", ESCAPE) == b"\\xe9\\xff\\u202e\\U0001f600"
    assert text.encode("utf-8", ESCAPE) == "é".encode() + b"\\xff" + "\u202e\U0001f600".encode()


def test_escaping_output_prints_what_the_stream_cannot_encode_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream under ``LC_ALL=C`` (ASCII): inside the block a name prints escaped; after it, strict again."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", stream)
    with escaping_output():
        print("wrote caf" + os.fsdecode(b"\xe9") + " é")
    stream.flush()
    assert raw.getvalue() == b"wrote caf\\xe9 \\xe9\n"
    assert stream.errors == "strict"
    with pytest.raises(UnicodeEncodeError):
        print("é")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="aliases go through Linux's /proc/self/fd")
def test_utf8_path_is_valid_utf8_and_reaches_the_same_file(tmp_path: Path) -> None:
    assert utf8_path(tmp_path / "f.txt") == str(tmp_path / "f.txt")  # valid already: itself
    folder = tmp_path / os.fsdecode(b"d\xe9")
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "f.txt").write_text("first")
    alias = utf8_path(folder / "sub" / "f.txt")
    alias.encode("utf-8")
    assert alias.startswith("/proc/self/fd/") and alias.endswith("/sub/f.txt")
    assert Path(alias).read_text() == "first"
    odd_file = tmp_path / os.fsdecode(b"f\xe9.txt")
    odd_file.write_text("own name")
    assert Path(utf8_path(odd_file)).read_text() == "own name"  # the file's own name not UTF-8


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="aliases go through Linux's /proc/self/fd")
def test_utf8_path_follows_a_folder_made_again(tmp_path: Path) -> None:
    """A folder removed and made again since the first alias: a later alias reaches the new folder's file."""
    folder = tmp_path / os.fsdecode(b"g\xe9")
    folder.mkdir()
    (folder / "f.txt").write_text("old")
    assert Path(utf8_path(folder / "f.txt")).read_text() == "old"
    (folder / "f.txt").unlink()
    folder.rmdir()
    folder.mkdir()
    (folder / "f.txt").write_text("new")
    assert Path(utf8_path(folder / "f.txt")).read_text() == "new"
