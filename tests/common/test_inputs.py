"""Checks on the files a user names before anything reads them (:mod:`biasviz.common.inputs`): a FIFO, device or
socket refused in words (never opened, so never a hang), sizes bounded at exactly the limit, UTF-8 strict or
replaced with a warning, and a checkpoint's side files checked the same way."""

from __future__ import annotations

import os
import socket
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import biasviz.common.inputs as inputs
from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import SIDE_FILE_BYTES, check_side_files, kind_of, read_bytes, read_text, regular_file


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket() -> Iterator[Path]:
    """A bound socket in a short folder (a socket's path is at most 107 bytes)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder, socket.socket(socket.AF_UNIX) as s:
        path = Path(folder) / "s"
        s.bind(str(path))
        yield path


def test_kind_of_says_what_a_path_is(tmp_path: Path, fifo: Path, unix_socket: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert kind_of(tmp_path / "f") == "" and kind_of(tmp_path / "missing") == ""
    assert kind_of(tmp_path) == "a folder"
    assert kind_of(fifo) == "a FIFO (named pipe)"
    assert kind_of(unix_socket) == "a socket"
    assert kind_of(Path(os.devnull)) == "a character device"


def test_regular_file_refuses_what_cannot_be_read_to_the_end(tmp_path: Path, fifo: Path) -> None:
    with pytest.raises(BiasvizError) as refused:
        regular_file(str(fifo), "config")
    assert str(refused.value) == (f"{fifo} is not a regular file but a FIFO (named pipe); give a config biasviz can "
                                  "read to the end")  # fmt: skip
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(BiasvizError, match="is not a regular file but a character device; give a file "):
        regular_file(tmp_path / "zero")  # through a link: what it points at
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert regular_file(str(tmp_path / "link")) == tmp_path / "link"
    assert regular_file(tmp_path / "missing") == tmp_path / "missing"  # left to the caller
    assert regular_file(tmp_path) == tmp_path  # a folder too: the caller says what it wanted


def test_read_bytes_reads_up_to_exactly_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "f.bin"
    f.write_bytes(b"\x00\x01" * 500)
    assert read_bytes(f, limit=1000) == b"\x00\x01" * 500
    assert read_bytes(f, limit=None) == b"\x00\x01" * 500
    with pytest.raises(BiasvizError) as refused:
        read_bytes(f, "device map", limit=999)
    assert str(refused.value) == (f"{f} is 1,000 bytes; a device map biasviz reads is at most 999 bytes: it is not "
                                  "one, or is damaged")  # fmt: skip
    assert SIDE_FILE_BYTES == 256 * 2**20


def test_read_bytes_errors_are_one_line_naming_the_file(tmp_path: Path, fifo: Path) -> None:
    with pytest.raises(BiasvizError, match=r"^cannot read .*missing\.json: No such file or directory; check the path$"):
        read_bytes(tmp_path / "missing.json")
    with pytest.raises(BiasvizError, match="not a regular file but a FIFO"):
        read_bytes(fifo)  # refused, not opened: nothing writes to it, and the test would hang


def test_a_fifo_put_in_place_after_the_check_is_refused_on_the_descriptor(
        tmp_path: Path, fifo: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The check passes (as if the file were swapped after it); the open does not block and fstat refuses it."""
    monkeypatch.setattr(inputs, "regular_file", lambda path, what="file": Path(path))
    with pytest.raises(BiasvizError) as refused:
        read_bytes(fifo, "config")
    assert str(refused.value) == f"{fifo} is not a regular file; give a config biasviz can read to the end"


def test_read_text_is_strict_utf8_or_replaces_with_a_warning(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_bytes("ab\u00e9".encode() + b"\xff!")
    with pytest.raises(BiasvizError) as refused:
        read_text(f)
    assert str(refused.value) == f"{f} is not UTF-8 text (undecodable byte 4); save it as UTF-8"
    with pytest.warns(UserWarning, match=r"undecodable byte 4\); its other bytes were replaced by U\+FFFD"):
        assert read_text(f, strict=False) == "ab\u00e9\ufffd!"
    f.write_text("données\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_text(f, strict=False) == read_text(f) == "données\n"
    with pytest.raises(BiasvizError, match="is 9 bytes; a text file biasviz reads is at most 8 bytes"):
        read_text(f, limit=8)


def test_side_files_are_checked_and_absent_ones_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_side_files(tmp_path)  # none there
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    check_side_files(tmp_path)
    monkeypatch.setattr(inputs, "SIDE_FILE_BYTES", 4)
    (tmp_path / "vocab.txt").write_text("12345")
    with pytest.raises(BiasvizError) as refused:
        check_side_files(tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'vocab.txt'} is 5 bytes; a checkpoint's vocab.txt biasviz reads is "
                                  "at most 4 bytes: it is not one, or is damaged")  # fmt: skip
    (tmp_path / "vocab.txt").write_text("1234")  # exactly the limit
    check_side_files(tmp_path)


def test_any_json_is_a_side_file_unless_told_otherwise(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "extra.json")
    with pytest.raises(BiasvizError, match=r"extra\.json is not a regular file but a FIFO .*give a checkpoint's "
                                           r"extra\.json biasviz"):
        check_side_files(tmp_path)
    check_side_files(tmp_path, every_json=False)
    os.mkfifo(tmp_path / "tokenizer.model")  # a listed side file: checked whatever every_json says
    with pytest.raises(BiasvizError, match=r"tokenizer\.model is not a regular file"):
        check_side_files(tmp_path, every_json=False)


def test_a_dangling_side_file_link_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(BiasvizError, match=r"^cannot read .*config\.json: No such file or directory; check the path$"):
        check_side_files(tmp_path)
