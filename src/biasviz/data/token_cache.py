"""A training corpus's tokenizer and token stream, kept between runs in a cache folder.

``make figures`` trains seven tiny models on the same built-in corpus: each run built the same byte-level BPE and
encoded the same 8 MB again, about 5 s of a 40 s run. The second run on a corpus now reads both back. The entry is
named by a SHA-256 of everything that decides its content (the documents, the vocabulary size or the given
tokenizer, the tokenizers library's version), and is checked as any file from outside is: the token file must be
a plain int32 array (no pickles), its SHA-256 the one recorded beside it, and every id inside the vocabulary. An
entry that fails a check is built again and replaced; a cache that cannot be written is not an error.

``BIASVIZ_CACHE`` names the folder (default: ``$XDG_CACHE_HOME/biasviz``, else ``~/.cache/biasviz``); ``off``
turns the cache off.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer

from biasviz.common.atomic import replacing
from biasviz.common.errors import BiasvizError
from biasviz.data.tokenizer import build_tokenizer, load_tokenizer
from biasviz.data.windows import encode

CACHE_ENV = "BIASVIZ_CACHE"
FORMAT = "biasviz-token-cache-1"
TOKENS_FILE, TOKENIZER_FILE, RECORD_FILE = "tokens.npy", "tokenizer.json", "record.json"


def cache_folder() -> Path | None:
    """Where entries go: ``BIASVIZ_CACHE``, or the user's cache folder; None when it is ``off``."""
    text = os.environ.get(CACHE_ENV, "").strip()
    if text.lower() == "off":
        return None
    if text:
        return Path(text).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
    return Path(base).expanduser() / "biasviz"


def corpus_key(documents: list[str], vocab_size: int, tokenizer: Tokenizer | None) -> str:
    """The SHA-256 naming an entry: the documents (each with its length, so that two splits of one text differ),
    what makes the tokenizer (its JSON, or the vocabulary size it is built to) and the library's version."""
    h = hashlib.sha256(f"{FORMAT}\0{tokenizers.__version__}\0".encode())
    made = tokenizer.to_str() if tokenizer is not None else f"bpe:{vocab_size}"
    h.update(made.encode("utf-8", "surrogatepass"))
    for doc in documents:
        raw = doc.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()


def tokenized(documents: list[str], vocab_size: int,
              tokenizer: Tokenizer | None = None) -> tuple[Tokenizer, np.ndarray]:  # fmt: skip
    """The tokenizer (``tokenizer``, or a BPE of ``vocab_size`` built on ``documents``) and the documents' token
    stream (:func:`biasviz.data.windows.encode`), from the cache where an entry holds them."""
    folder = cache_folder()
    entry = None if folder is None else folder / "corpus" / corpus_key(documents, vocab_size, tokenizer)
    if entry is not None and (kept := _read(entry, tokenizer)) is not None:
        return kept
    tok = tokenizer if tokenizer is not None else build_tokenizer(documents, vocab_size)
    tokens = encode(documents, tok)
    if entry is not None:
        _write(entry, tok, tokens)
    return tok, tokens


def _read(entry: Path, given: Tokenizer | None) -> tuple[Tokenizer, np.ndarray] | None:
    """The entry's tokenizer and tokens, or None where it is missing or fails a check."""
    try:
        record = json.loads((entry / RECORD_FILE).read_text(encoding="utf-8"))
        raw = (entry / TOKENS_FILE).read_bytes()
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            return None
        if hashlib.sha256(raw).hexdigest() != record.get("tokens_sha256"):
            return None
        tokens = np.load(io.BytesIO(raw), allow_pickle=False)
        tok = given if given is not None else load_tokenizer(entry / TOKENIZER_FILE)
    except (OSError, ValueError, BiasvizError):
        return None
    if tokens.dtype != np.int32 or tokens.ndim != 1:
        return None
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= tok.get_vocab_size()):
        return None
    return tok, tokens


def _write(entry: Path, tok: Tokenizer, tokens: np.ndarray) -> None:
    """Store an entry, each file replaced in one step (a parallel run reads a whole file or none); the record
    last, so that an entry without one is never read."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(tokens, dtype=np.int32), allow_pickle=False)
    raw = buffer.getvalue()
    try:
        entry.mkdir(parents=True, exist_ok=True)
        _replace(entry / TOKENS_FILE, raw)
        _replace(entry / TOKENIZER_FILE, tok.to_str().encode("utf-8"))
        record = {"format": FORMAT, "tokens_sha256": hashlib.sha256(raw).hexdigest(), "tokens": int(tokens.size)}
        _replace(entry / RECORD_FILE, json.dumps(record).encode("utf-8"))
    except (OSError, BiasvizError):  # a read-only home, a full disk: the run goes on without the cache
        return


def _replace(target: Path, raw: bytes) -> None:
    with replacing(target) as tmp:  # written beside the target, moved into place in one step
        tmp.write_bytes(raw)


__all__ = ["CACHE_ENV", "cache_folder", "corpus_key", "tokenized"]
