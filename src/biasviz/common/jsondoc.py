"""JSON from outside (a config, training.json, a device map, a file's attribute): bounded before it is parsed.

Python's parser recurses once per level of nesting: a document nested 50,000 deep is a RecursionError (and in a
thread with a small stack, a crash), and a huge one takes the memory first. Every JSON biasviz reads from a
file, an option or an HDF5 attribute goes through :func:`loads`, which refuses both with one clear message.
"""

from __future__ import annotations

import json
import re
from typing import Any

from biasviz.common.errors import BiasvizError

MAX_DEPTH = 64  # levels of nesting: configs and maps use a handful
MAX_BYTES = 64 << 20  # a config or map is kilobytes; a safetensors header of many tensors megabytes
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)  # strings (skipped whole) and brackets


class JSONTooLarge(BiasvizError, ValueError):
    """A JSON document deeper or larger than biasviz reads (a ValueError, as a malformed one is)."""


def nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings do not count).

    >>> nesting('{"a": [1, {"b": "[[["}]}'), nesting("3")
    (3, 0)
    """
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def loads(text: str | bytes, what: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """``json.loads(text)``, refusing a document of more than ``max_bytes`` or nested deeper than 64 levels.

    ``what`` names the document in the message (``config.json of DIR``, ``--device-map FILE``). Malformed JSON
    is json's own ValueError, as before; the two refusals are :class:`JSONTooLarge` (a ValueError too).
    """
    if len(text) > max_bytes:
        raise JSONTooLarge(f"{what} is {len(text) / 1e6:.1f} MB of JSON, more than the {max_bytes / 1e6:.0f} MB "
                           "biasviz reads from such a document; is it the right file?")  # fmt: skip
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")
    if text.count("[") + text.count("{") > MAX_DEPTH and nesting(text) > MAX_DEPTH:  # few brackets: none deep
        raise JSONTooLarge(f"{what} nests arrays or objects more than {MAX_DEPTH} levels deep; no configuration "
                           "biasviz reads does: the file is damaged or made to crash a reader")  # fmt: skip
    try:
        return json.loads(text)
    except RecursionError:  # a stack smaller than the bound allows (a thread's): the same refusal
        raise JSONTooLarge(f"{what} nests arrays or objects too deeply to read") from None


__all__ = ["JSONTooLarge", "MAX_DEPTH", "loads", "nesting"]
