"""Token streams and reproducible fixed-length windows cut from them."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from biasviz.data.tokenizer import eos_id
from biasviz.errors import BiasvizError


def encode(documents: list[str], tok: Tokenizer) -> np.ndarray:
    """One int32 stream of all documents, separated by EOS where the tokenizer has one."""
    sep = eos_id(tok)
    parts: list[np.ndarray] = []
    for enc in tok.encode_batch(documents):
        parts.append(np.asarray(enc.ids, dtype=np.int32))
        if sep is not None:
            parts.append(np.asarray([sep], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


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
