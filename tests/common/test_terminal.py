"""Text made inert for a terminal (:mod:`biasviz.common.terminal`): every character that is not printable is
written as an escape of its code point (a name's byte that is not UTF-8 as that byte), printable text of any script
is left alone, and a line printed through :func:`say` carries no control character."""

from __future__ import annotations

import os

import pytest

from biasviz.common.terminal import inert, say


@pytest.mark.parametrize("text", ["plain", "données", "日本語のテキスト", "a\\x1b", "", "tab-free, 100 %"])
def test_printable_text_is_left_as_it_is(text: str) -> None:
    assert inert(text) == text


@pytest.mark.parametrize(("text", "want"), [
    ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # retitles the window
    ("\x1b[2J", "\\x1b[2J"),  # clears the screen
    ("a\nError: fake", "a\\x0aError: fake"),  # a second line that looks like biasviz's
    ("\r\t\x00\x7f", "\\x0d\\x09\\x00\\x7f"),
    ("\x85\xa0", "\\x85\\xa0"),  # C1 control and no-break space (not printable to Python): still \xNN below 0x100
    ("\u202eabc", "\\u202eabc"),  # shows a line reversed
    ("\u2028", "\\u2028"),  # a line separator
    ("\U000e0001", "\\U000e0001"),  # a format character beyond the BMP: eight digits
    ("caf" + os.fsdecode(b"\xe9"), "caf\\xe9"),  # a byte that is not UTF-8: the byte itself
])  # fmt: skip
def test_each_character_that_is_not_printable_is_escaped(text: str, want: str) -> None:
    assert inert(text) == want
    assert inert(text).isprintable()


def test_lines_keeps_the_newlines_and_escapes_the_rest() -> None:
    assert inert("a\x1b\nb\rc\n", lines=True) == "a\\x1b\nb\\x0dc\n"
    assert inert("a\nb", lines=False) == "a\\x0ab"


def test_say_writes_one_inert_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    say("Error", "bad\x1b[2J\nError: fake")
    out, err = capsys.readouterr()
    assert out == "" and err == "Error: bad\\x1b[2J\\x0aError: fake\n"
