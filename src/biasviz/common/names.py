"""Names from outside (paths, file names) as text that every file format can hold.

Linux allows any bytes but ``/`` and NUL in a file name; Python hands a name that is not valid UTF-8 over as a
``str`` with lone surrogates (``b'caf\\xe9.txt'`` is ``'caf\\udce9.txt'``), which no UTF-8 writer accepts: not
HDF5's string attributes, PNG text chunks, PDF document info, JSON readers outside Python, HTML pages, nor the
Rust libraries (safetensors, tokenizers) that take paths. The file system calls keep the original name (Python's
``surrogateescape`` gives the same bytes back); every record of a name goes through :func:`display_name`, and
every text written into a file's metadata through :func:`utf8_text`, so nothing fails on a name the system allows.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

#: a byte that is not UTF-8, as Python's surrogateescape decodes it
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
#: any other lone surrogate (a name made up in Python, not read from a file system)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _byte(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()) - 0xDC00:02x}"


def _utf8_valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def display_name(name: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """``name`` (a path or file name) as valid UTF-8 text that tells it apart from every other name.

    A name that is valid UTF-8 and holds no backslash is kept as it is (the usual case: records stay as they
    were). Any other name is escaped: each byte that is not UTF-8 as ``\\xNN``, each backslash as ``\\\\``, so
    that a text with a backslash is always an escaped name and :func:`name_bytes` gives the name back.

    >>> display_name("données/a.txt"), display_name(b"caf\\xe9.txt"), display_name("a\\\\b")
    ('données/a.txt', 'caf\\\\xe9.txt', 'a\\\\\\\\b')
    """
    text = os.fsdecode(os.fspath(name))
    if "\\" not in text and _utf8_valid(text):
        return text
    text = text.replace("\\", "\\\\")
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", _ESCAPED_BYTE.sub(_byte, text))


def name_bytes(shown: str) -> bytes:
    """The file system's bytes of a name that :func:`display_name` showed as ``shown`` (its inverse).

    >>> name_bytes("caf\\\\xe9.txt"), name_bytes("données")
    (b'caf\\xe9.txt', b'donn\\xc3\\xa9es')
    """
    if "\\" not in shown:
        return os.fsencode(shown)
    out = bytearray()
    parts = re.split(r"(\\\\|\\x[0-9a-f]{2}|\\u[0-9a-f]{4})", shown)
    for part in parts:
        if part == "\\\\":
            out += b"\\"
        elif part.startswith("\\x"):
            out.append(int(part[2:], 16))
        elif part.startswith("\\u"):
            out += chr(int(part[2:], 16)).encode("utf-8", "surrogatepass")
        else:
            out += part.encode("utf-8")
    return bytes(out)


def utf8_text(text: str) -> str:
    """``text`` with every lone surrogate (a name's byte that is not UTF-8) written out as ``\\xNN`` or ``\\uNNNN``:
    valid UTF-8 for a file's metadata, whatever names it quotes. Text that is valid already is returned as it is.

    Where a text is only a name, :func:`display_name` is the unambiguous form; this is the net under every
    writer of metadata, for names quoted inside longer texts.
    """
    if text.isascii() or _utf8_valid(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", _ESCAPED_BYTE.sub(_byte, text))


def utf8_data(value: Any) -> Any:
    """``value`` (JSON-like data: mappings, lists, strings) with :func:`utf8_text` applied to every string, keys
    included; paths become :func:`display_name`. Other values are returned as they are."""
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, Path):
        return display_name(value)
    if isinstance(value, Mapping):
        return {utf8_data(k): utf8_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [utf8_data(v) for v in value]
    return value


#: the error handler of the CLI's stdout and stderr: a message that quotes a name the terminal cannot show prints it
#: escaped (a byte that is not UTF-8 as ``\xNN``, any other character as Python's backslashreplace writes it)
ESCAPE = "biasviz.escape"


def _escape(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    shown = [_byte_of(c) if "\udc80" <= c <= "\udcff" else c.encode("ascii", "backslashreplace").decode() for c in bad]
    return "".join(shown), exc.end


def _byte_of(c: str) -> str:
    return f"\\x{ord(c) - 0xDC00:02x}"


codecs.register_error(ESCAPE, _escape)


@contextlib.contextmanager
def escaping_output() -> Iterator[None]:
    """Within the block, text written to stdout and stderr that their encoding cannot hold (a name that is not
    UTF-8; anything but ASCII under ``LC_ALL=C``) is written escaped instead of raising UnicodeEncodeError."""
    streams = [s for s in (sys.stdout, sys.stderr) if isinstance(s, io.TextIOWrapper)]
    before = [s.errors for s in streams]
    for stream in streams:
        with contextlib.suppress(ValueError, OSError):  # closed, or not reconfigurable: left as it is
            stream.reconfigure(errors=ESCAPE)
    try:
        yield
    finally:
        for stream, errors in zip(streams, before, strict=True):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors=errors)


_ALIASES: dict[str, int] = {}  # folder -> an O_PATH descriptor on it, open while the process runs


def utf8_path(path: str | os.PathLike[str]) -> str:
    """A path to the same file that is valid UTF-8, for libraries that refuse any other (safetensors, tokenizers).

    ``path`` itself when it is valid UTF-8. Otherwise (Linux) ``/proc/self/fd/N/REST``: N a descriptor held open
    on the deepest folder of ``path`` whose name is not UTF-8 (the file itself when its own name is not), REST the
    valid rest. The file is read or written where the user pointed, under whatever name; a later read of the
    same file (a model's weights read lazily) still finds it. Where there is no ``/proc``, ``path`` unchanged.
    """
    text = os.fspath(path)
    if _utf8_valid(text) or not os.path.isdir("/proc/self/fd"):
        return text
    absolute = os.path.abspath(text)
    parts = absolute.split(os.sep)
    last = max(i for i, part in enumerate(parts) if not _utf8_valid(part))
    head, rest = os.sep.join(parts[: last + 1]), parts[last + 1 :]
    fd = _ALIASES.get(head)
    if fd is None or not _same(fd, head):  # a folder removed and made again since: hold the new one
        fd = os.open(head, getattr(os, "O_PATH", os.O_RDONLY) | os.O_CLOEXEC)
        old, _ALIASES[head] = _ALIASES.get(head), fd
        if old is not None:
            os.close(old)
    return os.path.join(f"/proc/self/fd/{fd}", *rest)


def _same(fd: int, path: str) -> bool:
    """Whether descriptor ``fd`` still holds the file that ``path`` names."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


__all__ = ["ESCAPE", "display_name", "escaping_output", "name_bytes", "utf8_data", "utf8_path", "utf8_text"]
