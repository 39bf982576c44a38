"""Token streams and reproducible fixed-length windows cut from them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer

from biasviz.common.errors import BiasvizError
from biasviz.data.tokenizer import eos_id, tokenizer_boundary


def encode(documents: list[str], tok: Tokenizer) -> np.ndarray:
    """One int32 stream of all documents, separated by EOS where the tokenizer has one."""
    sep = eos_id(tok)
    parts: list[np.ndarray] = []
    with tokenizer_boundary("the model"):  # a crafted tokenizer.json can make the library panic here
        encoded = tok.encode_batch(documents)
    for enc in encoded:
        parts.append(np.asarray(enc.ids, dtype=np.int32))
        if sep is not None:
            parts.append(np.asarray([sep], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


SPAN_PER_WINDOW = 16  # windows are drawn from the first 16 x samples x seq_len tokens of the text ...
MIN_SPAN = 1 << 18  # ... and at least from its first 262,144 tokens (about 1 MB of text)


def window_span(n: int, seq_len: int) -> int:
    """How many tokens of text :func:`sample_windows` draws ``n`` windows of ``seq_len`` from."""
    return max(MIN_SPAN, SPAN_PER_WINDOW * n * seq_len)


def encode_prefix(documents: Iterable[str], tok: Tokenizer, n_tokens: int, batch: int = 16) -> np.ndarray:
    """The token stream of :func:`encode`, cut after the first ``n_tokens``: only the text needed is read
    and tokenized (a few windows from an 8 MB corpus no longer tokenize all of it).

    Documents are tokenized ``batch`` at a time, and once some are, a batch ends early where its characters, at the
    tokens per character seen so far, cover what is missing: a last full batch tokenized 12 % more text than the
    default span needs, to throw it away. Each document is tokenized on its own, so batches do not change the ids.
    """
    parts: list[np.ndarray] = []
    have = seen = 0  # tokens made, and characters they were made from
    pending: list[str] = []
    chars = 0  # in pending
    for doc in documents:
        pending.append(doc)
        chars += len(doc)
        if len(pending) == batch or (have and chars * have >= (n_tokens - have) * seen):
            have += _append(parts, encode(pending, tok))
            seen += chars
            pending, chars = [], 0
            if have >= n_tokens:
                break
    else:
        if pending:
            have += _append(parts, encode(pending, tok))
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return stream[:n_tokens]


def _append(parts: list[np.ndarray], tokens: np.ndarray) -> int:
    parts.append(tokens)
    return len(tokens)


def sample_windows(tokens: np.ndarray, n: int, seq_len: int, seed: int) -> np.ndarray:
    """``n`` windows of ``seq_len`` tokens at random offsets drawn from ``seed``: (n, seq_len) int32.

    The same stream, n, seq_len and seed always give the same windows.

    >>> sample_windows(np.arange(10, dtype=np.int32), 2, 4, seed=0).shape
    (2, 4)
    """
    if len(tokens) < seq_len:
        raise BiasvizError(
            f"the text has {len(tokens)} tokens, fewer than --seq-len {seq_len}; give more text or a shorter length"
        )
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(tokens) - seq_len + 1, size=n)
    return np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int32)
