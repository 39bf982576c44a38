"""The text of each token id in a file, decoded once when the page is built (the page itself has no tokenizer).

``extract`` records in the root attribute ``tokenizer`` where its tokenizer came from: a path to a
``tokenizer.json`` (``--tokenizer``), ``"<checkpoint> (the checkpoint's own)"``, or the byte-level
fallback. Any of these that can still be found gives token strings; otherwise the page shows ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from biasviz.common.errors import BiasvizError

OWN_SUFFIX = " (the checkpoint's own)"
BYTE_LEVEL_PREFIX = "byte-level"


def find_tokenizer(attrs: dict[str, Any], override: str | Path | None = None) -> tuple[Any, str]:
    """A ``tokenizers.Tokenizer`` (or the string ``'bytes'``) for the file, and where it came from.

    ``(None, reason)`` when none is known: the page then shows token ids.
    """
    from biasviz.data import load_tokenizer

    if override is not None:
        return load_tokenizer(override), str(override)
    recorded = attrs.get("tokenizer")
    if not isinstance(recorded, str) or not recorded:
        return None, "the file records no tokenizer"
    if recorded.startswith(BYTE_LEVEL_PREFIX):
        return "bytes", "UTF-8 bytes"
    where = Path(recorded.removesuffix(OWN_SUFFIX)).expanduser()
    candidates = [where, where / "tokenizer.json"] if where.is_dir() else [where]
    for candidate in candidates:
        if candidate.is_file():
            try:
                return load_tokenizer(candidate), str(candidate)
            except BiasvizError as exc:
                return None, str(exc)
    return None, f"the tokenizer the file names ({recorded}) is not on this machine"


def token_strings(tokenizer: Any, ids: Iterable[int]) -> dict[int, str]:
    """The text of each id (as the tokenizer decodes it alone); ids it does not know are left out.

    >>> token_strings("bytes", [104, 10, 256])
    {10: '\\\\n', 104: 'h', 256: '<|endoftext|>'}
    """
    out: dict[int, str] = {}
    for i in sorted({int(x) for x in ids if int(x) >= 0}):
        text = _byte_text(i) if tokenizer == "bytes" else _decoded(tokenizer, i)
        if text is not None:
            out[i] = text
    return out


def _byte_text(i: int) -> str | None:
    if i == 256:
        return "<|endoftext|>"
    if i > 255:
        return None
    return chr(i) if 32 <= i < 127 else f"\\x{i:02x}" if i != 10 else "\\n"


def _decoded(tokenizer: Any, i: int) -> str | None:
    text = tokenizer.decode([i], skip_special_tokens=False)
    if not text:
        text = tokenizer.id_to_token(i)
    return None if text is None else text


__all__ = ["find_tokenizer", "token_strings"]
