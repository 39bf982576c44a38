"""Text from files and names, made inert before it reaches a terminal.

An attribute, a path or a library's message may hold control characters: ESC and BEL sequences that retitle
the window, clear the screen or hide text, bidirectional overrides that show a line reversed, a newline that
fakes a second ``Error:`` line. Every line biasviz prints that carries such text passes through :func:`inert`,
which writes each character that is not printable as an escape (``\\x1b``, ``\\u202e``) and leaves the rest.
"""

from __future__ import annotations

import click


def _escape(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a name that is not UTF-8 (surrogateescape): the byte itself
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def inert(text: str, *, lines: bool = False) -> str:
    """``text`` with every character that is not printable (controls, format characters, line separators)
    escaped; ``lines``: newlines kept, for a text of several lines.

    >>> inert("gpt\\x1b]0;x\\x07 \\u202eabc")
    'gpt\\\\x1b]0;x\\\\x07 \\\\u202eabc'
    >>> inert("a\\nb"), inert("a\\nb", lines=True)
    ('a\\\\x0ab', 'a\\nb')
    """
    if text.isprintable():
        return text
    if lines:
        return "\n".join(inert(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def say(level: str, message: str) -> None:
    """One ``Error:``, ``Warning:`` or ``note:`` line on stderr, its text inert."""
    click.echo(f"{level}: {inert(message)}", err=True)


__all__ = ["inert", "say"]
